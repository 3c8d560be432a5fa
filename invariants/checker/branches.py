"""Which arm of an `if` a call stands in, for rules that judge a function's choice of thread.

An `if` in a function's own body, outside any loop of it, whose test names nothing the
caller passes in (parameters other than `self` and `cls`), picks one arm for a whole run
of the function from the object's or the server's own state: a mode, not a per-request
path. Two calls in its two arms never both run in one run (INV119), and an arm that runs
MLX inline where the other hands the same work to a worker is the mode without that
worker (INV108), as is one that makes inline a call the other arm puts off in a def of its
own for another thread to run (INV120).
"""

from __future__ import annotations

import libcst as cst

from mlx_invariants.checker.nodes import children
from mlx_invariants.checker.walker import OWN_BODY_STOP, descendants


class Arms:
    def __init__(self, function: cst.FunctionDef) -> None:
        self.parent: dict[int, cst.CSTNode] = {}
        stack: list[cst.CSTNode] = [function]
        while stack:
            node = stack.pop()
            for child in children(node):
                self.parent[id(child)] = node  # a nested def too: where it stands, not what is in it
                if not isinstance(child, OWN_BODY_STOP):
                    stack.append(child)
        # What a caller passes in; the object itself (`self`, `cls`) is the same every run.
        self.params = {p.name.value for p in (*function.params.posonly_params, *function.params.params,
                                              *function.params.kwonly_params)} - {"self", "cls"}
        self.above: dict[int, dict[int, cst.CSTNode]] = {}  # per node: the nodes around it, by id

    def exclusive(self, site: cst.CSTNode, other: cst.CSTNode) -> bool:
        """`site` and `other` stand in the two arms of one mode `if`."""
        around = self._around(other)
        meet = self.parent.get(id(site))
        while meet is not None and id(meet) not in around:
            meet = self.parent.get(id(meet))
        return isinstance(meet, cst.If) and self._mode(meet)

    def retried(self, site: cst.CSTNode, other: cst.CSTNode) -> bool:
        """`site` stands in an `except` arm of a `try` whose body holds `other`: the retry of a call the
        body made (`try: generate(..., temp=t)` / `except TypeError: generate(...)`, one library version's
        spelling, then another's)."""
        around = self._around(other)
        child, node = site, self.parent.get(id(site))
        while node is not None:
            if isinstance(node, cst.Try) and isinstance(child, cst.ExceptHandler) and id(node.body) in around:
                return True
            child, node = node, self.parent.get(id(node))
        return False

    def beside(self, site: cst.CSTNode, others: list[cst.CSTNode]) -> bool:
        """Some mode `if` around `site` has one of `others` in its other arm."""
        arm, node = site, self.parent.get(id(site))
        while node is not None:
            if isinstance(node, cst.If) and (arm is node.body or arm is node.orelse) and self._mode(node):
                for other in others:
                    around = self._around(other)
                    if id(node) in around and id(arm) not in around:
                        return True
            arm, node = node, self.parent.get(id(node))
        return False

    def _mode(self, branch: cst.If) -> bool:
        node = self.parent.get(id(branch))
        while node is not None:
            if isinstance(node, cst.For | cst.While):
                return False  # each round of the loop chooses again
            node = self.parent.get(id(node))
        tested = [branch.test, *descendants(branch.test)]
        return not any(isinstance(n, cst.Name) and n.value in self.params for n in tested)

    def _around(self, node: cst.CSTNode) -> dict[int, cst.CSTNode]:
        found = self.above.get(id(node))
        if found is None:
            found = self.above[id(node)] = {}
            current = self.parent.get(id(node))
            while current is not None:
                found[id(current)] = current
                current = self.parent.get(id(current))
        return found
