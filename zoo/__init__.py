"""The zoo: public MLX servers from the package index, pinned, installed apart, fuzzed over HTTP.

`recipes` says what each server is (pinned requirements, the command that starts it on
127.0.0.1 with a local model folder, what it answers on); `install` puts each into its own
venv under a cache folder, never into ours; `run` fuzzes every recipe through
`invariants fuzz --server-cmd` and re-runs the standalone reproducers in `reproducers/`;
`doc` writes docs/zoo.md from the result. `bash ci/zoo.sh install|run` is the front door.

The zoo is a user of mlx-invariants, like `benchmarks/`: it imports the product as
`mlx_invariants.*`, nothing in the product imports it, and it is not in the wheel. It runs
from a checkout (`python -m zoo` from the repository root, which is what ci/zoo.sh does);
every path it writes or reads is computed from this folder, never from the working folder.
"""
