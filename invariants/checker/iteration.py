"""Which builtins iterate what they are given, shared by the per-file rules (libcst) and the
package model (ast): both must agree on where a generator's body runs.

Calling a generator function runs none of its body; iterating it does. `list(tokens())` runs it
in place; `zip(generate_step(...), range(n))` runs it wherever the zip is iterated (mlx-lm's own
`generate` drove `generate_step` that way), so a `for` over the zip is a `for` over the generator.
"""

from __future__ import annotations

# Builtins that iterate their argument at once.
CONSUMERS = frozenset({"list", "tuple", "set", "frozenset", "sorted", "sum", "min", "max", "any", "all", "dict",
                       "next"})
# Builtins whose result, when iterated, iterates their arguments.
LAZY = frozenset({"enumerate", "zip", "map", "filter", "reversed", "iter"})
