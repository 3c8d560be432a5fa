"""The fuzzer's defaults, each named once: the CLI's help, the target and the settings read them here."""

from __future__ import annotations

# The reference engine as installed; a copy elsewhere (a mutant) names its own package.
ENGINE_PACKAGE = "mlx_invariants.engine"
ROUTE = "simple"   # the route `invariants fuzz` fuzzes when no target is named
# The thread-name glob of the reference engines' MLX owner thread.
REFERENCE_OWNER = "mlx-owner*"
# The model field sent to an HTTP server: what mlx_lm.server expects for the model it was started with.
HTTP_MODEL = "default_model"
REPORT_DIR = "fuzz-reports"
REPLAYS = 3        # automatic replays of a failure on fresh engines ("reproduced k/N")
CONFIRM = 2        # of those, how many must show it again before a timing or output finding counts
SHRINK_S = 60.0    # shrinking stops after this long with the smallest failure so far
SHRINK_FLOOR_S = 5.0   # ... or at the budget's end, but a failure found then still gets this long
KEEP_GOING_SHRINK_SHARE = 0.25  # with --keep-going, one finding is shrunk for at most this share of the budget
                                # left (and no more than SHRINK_S): the search for the next bug needs the rest
FIRST_START_S = 180.0     # an engine's first start: a launched server's until it answers, an in-process one's
                          # `start()` (vllm-mlx's imports and start took 45 to 80 s on a loaded 2-core box)
FIRST_USE_STALL_S = 60.0  # the baseline's stall backstop: an engine's first MLX calls compile kernels (on a
                          # GPU seconds per kernel, more with other processes compiling too), not a stall
BUDGET_GRACE_S = 5.0   # past the budget, confirming, shrinking and replaying stop (the scenario in flight ends)
