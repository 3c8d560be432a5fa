#!/usr/bin/env bash
# The zoo of public MLX servers (zoo/, docs/zoo.md). Never part of the default install, the wheel or the test run:
# it runs from a checkout, as `python -m zoo` from the repository root, and imports the product as mlx_invariants.
#   bash ci/zoo.sh install [NAME...]                       pinned servers into venvs under ~/.cache/mlx-invariants/zoo
#   bash ci/zoo.sh run [--budget S] [--seeds N | --seed S ...] [--note TEXT] [--repro-runs N] [NAME...]
#                                                          fuzz each, run the reproducers, write zoo/results/zoo.json
#                                                          and docs/zoo.md
#   bash ci/zoo.sh list | doc
# MLX_INVARIANTS_ZOO_CACHE moves the cache. Needs the package index (first install only).
set -euo pipefail
cd "$(dirname "$0")/.."
bash ci/setup.sh
exec .venv/bin/python -m zoo "$@"
