"""Standalone reproducers of the zoo's findings: each file is a script, run as `python FILE -- SERVER-CMD`.

They import nothing of mlx-invariants (only the standard library and httpx), so a server's
maintainers can run one without our harness. `zoo run` finds them next to itself, in the checkout.
"""
