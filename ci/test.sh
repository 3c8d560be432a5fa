#!/usr/bin/env bash
# The test suite, exactly as CI runs it: set-up, static self-check, then pytest.
# With no arguments the suite runs as two pytest processes side by side over disjoint folders: most tests
# wait on child processes, servers and sockets rather than compute, so on a 2-core box two processes take
# about half the wall time of one. Arguments (test paths, -m, -k ...) run one pytest process as given.
set -euo pipefail
cd "$(dirname "$0")/.."
bash ci/setup.sh
.venv/bin/invariants check engine fuzz invariants
PYTEST=(.venv/bin/python -m pytest -q -p no:cacheprovider)
if [ $# -gt 0 ]; then
    exec "${PYTEST[@]}" "$@"
fi
# The second group is everything else, so a new test folder or file can never be left out; the fuzz files
# test_a* to test_f* go with it to even the two groups' wall time out (docs/ci.md).
GROUPS_=("tests/fuzz tests/reliability tests/zoo --ignore-glob=tests/fuzz/test_[a-f]*"
         "tests --ignore=tests/reliability --ignore=tests/zoo --ignore-glob=tests/fuzz/test_[!a-f]*")
set -f  # the groups' globs are pytest's to read, not the shell's
logs=$(mktemp -d)
pids=()
for i in "${!GROUPS_[@]}"; do
    # shellcheck disable=SC2086  # each group is a list of folders
    # the slowest tests of each group named at the end: where the suite's time goes, on every run
    "${PYTEST[@]}" --durations=15 ${GROUPS_[$i]} >"$logs/$i.log" 2>&1 &
    pids+=($!)
done
status=0
for i in "${!pids[@]}"; do
    code=0
    wait "${pids[$i]}" || code=$?
    echo "== pytest ${GROUPS_[$i]} (exit $code)"
    cat "$logs/$i.log"
    [ "$code" -eq 0 ] || status=$code
done
rm -rf "$logs"
exit "$status"
