#!/usr/bin/env bash
# The test suite, exactly as CI runs it: set-up, static self-check, then pytest.
# With no arguments the suite runs as three pytest processes side by side over disjoint folders and files: a
# test spends about a fifth of its time waiting on child processes, servers, sockets and timers rather than
# computing, so on a 2-core box a third process fills the cores while the other two wait (docs/ci.md).
# Arguments (test paths, -m, -k ...) run one pytest process as given.
set -euo pipefail
cd "$(dirname "$0")/.."
bash ci/setup.sh
.venv/bin/invariants check engine fuzz invariants
PYTEST=(.venv/bin/python -m pytest -q -p no:cacheprovider)
if [ $# -gt 0 ]; then
    exec "${PYTEST[@]}" "$@"
fi
# The last group is everything else, so a new test folder or file can never be left out; the fuzz files are
# split among the three by their first letter to even the groups' wall time out (docs/ci.md).
GROUPS_=("tests/fuzz tests/reliability tests/zoo --ignore-glob=tests/fuzz/test_[a-fs-z]*"
         "tests/fuzz --ignore-glob=tests/fuzz/test_[g-rt-z]*"
         "tests --ignore=tests/reliability --ignore=tests/zoo --ignore-glob=tests/fuzz/test_[a-s]*")
set -f  # the groups' globs are pytest's to read, not the shell's
logs=$(mktemp -d)
pids=()
for i in "${!GROUPS_[@]}"; do
    # shellcheck disable=SC2086  # each group is a list of folders
    "${PYTEST[@]}" ${GROUPS_[$i]} >"$logs/$i.log" 2>&1 &
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
