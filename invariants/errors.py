"""The one error every layer may raise at the user.

`UsageError` is a setup or command-line mistake: an unknown rule or engine, a
missing path, a server command that cannot start. The console script prints
its message and exits 2; it is never reported as a finding.
"""

from __future__ import annotations


class UsageError(Exception):
    """What the user asked for cannot be done as asked; the message says what to change."""
