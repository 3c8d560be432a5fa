#!/usr/bin/env bash
# The zoo of public MLX servers (docs/zoo.md). Never part of the default install or test run.
#   bash ci/zoo.sh install [NAME...]                       pinned servers into venvs under ~/.cache/mlx-invariants/zoo
#   bash ci/zoo.sh run [--budget S] [--seed N] [--note TEXT] [--repro-runs N] [NAME...]
#                                                          fuzz each, run the reproducers, write docs/zoo.md
#   bash ci/zoo.sh list | doc
# MLX_INVARIANTS_ZOO_CACHE moves the cache. Needs the package index (first install only).
set -euo pipefail
cd "$(dirname "$0")/.."
bash ci/setup.sh
exec .venv/bin/python -m mlx_invariants.fuzz.zoo "$@"
