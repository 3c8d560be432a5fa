"""An adapter whose process dies (like a Metal abort) when request r0 is submitted: for the jobs tests."""

from __future__ import annotations

import os
import signal

from mlx_invariants.fuzz.adapters.reference import reference_engine


def make():
    adapter = reference_engine("simple")()
    submit = adapter.submit

    async def dying_submit(spec):
        if spec.rid.startswith("r0"):
            os.kill(os.getpid(), signal.SIGKILL)
        return await submit(spec)
    adapter.submit = dying_submit
    return adapter
