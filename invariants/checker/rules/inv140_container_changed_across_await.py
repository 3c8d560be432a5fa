from __future__ import annotations

import libcst as cst

from mlx_invariants.checker.names import dotted
from mlx_invariants.checker.rule import Invalid, Rule, Valid
from mlx_invariants.checker.walker import descendants

_FUNCTIONS = (cst.FunctionDef, cst.Lambda, cst.ClassDef)
_MUTATORS = frozenset({"add", "remove", "discard", "pop", "popitem", "clear", "update", "setdefault",
                       "difference_update", "intersection_update", "symmetric_difference_update"})
_VIEWS = frozenset({"items", "keys", "values"})
_SETS = frozenset({"set", "builtins.set", "weakref.WeakSet"})
_DICTS = frozenset({"dict", "builtins.dict", "collections.defaultdict", "collections.OrderedDict",
                    "weakref.WeakValueDictionary", "weakref.WeakKeyDictionary"})


class ContainerChangedAcrossAwait(Rule):
    """A `for` loop over a set or a dict (or a dict's keys, values or items) that awaits inside its body gives up
    the event loop in the middle of the iteration. Any other coroutine may run then, and when it adds to or removes
    from that same container (a websocket that disconnects, a task that finishes and unregisters itself), the
    loop's next step raises `RuntimeError: Set changed size during iteration` (or `dictionary changed size`): a
    broadcast to subscribers dies half-way, and whatever the loop was doing for the rest is skipped.
    docling-project/docling-serve's WebSocket notifier walked its `task_subscribers` dict to push queue positions,
    awaiting each task's status inside the loop, while `add_task` and the status handlers added and popped
    entries (docling_serve/websocket_notifier.py@d65dee4:64, fixed in dfec81c by iterating copies).

    It matches a loop in an `async def` over a container the file shares between functions (an attribute its
    class assigns a set or a dict, `self.subscribers = set()`, `defaultdict(set)`, or a module-level one), or over
    one entry of such a dict (`self.subscribers[task_id]`), whose body awaits, when another function of the
    class (or, for a module-level container, of the module) changes it: `add`, `remove`, `discard`, `pop`,
    `clear`, `update`, `setdefault`, `del c[k]`, `c[k] = v`. A loop over a copy (`list(self.subscribers)`,
    `tuple(...)`, `sorted(...)`, `.copy()`) is fine, and so is a list (it raises nothing; see known problems)."""

    id = "INV140"
    catches = "a loop over a shared set or dict that awaits in its body, while another function of the class or module changes it"
    message = (
        "this loop iterates `{container}` ({kind}) and awaits inside it, while `{changer}` changes it: when that runs "
        "during the await, the loop's next step raises \"RuntimeError: {what} changed size during iteration\"; "
        "iterate over a copy (`for ... in list({container}):`)"
    )
    known_problems = (
        "Only containers the file shows to be sets or dicts are judged: a list changed during the await raises "
        "nothing but skips or repeats elements, and a container made elsewhere is not typed. A change that "
        "cannot run while the loop waits (the other function is only called before the loop starts) is "
        "reported all the same."
    )
    # Opt-in: on the HEADs of the 281 repositories mirrored here (issue 23), 21 findings graded blind: 1 true, 8
    # arguable, 12 false. Most containers are registries filled at start-up (`register()`, `initialize()`), whose
    # changes cannot run while a later loop waits, or are guarded by a lock both sides take; the function the message
    # names is the first changer in the file, not always the one that runs. It detects heldout21's DLS-WSITER
    # (studied) when selected, silent at its fix.
    default_enabled = False
    triggers = (("for ",), ("await",), ("remove", "discard", "pop", "del ", "add", "clear", "update", "setdefault"))

    INVALID = [
        Invalid('''
            from collections import defaultdict


            class Notifier:
                def __init__(self):
                    self.subscribers = defaultdict(set)

                def subscribe(self, task_id, websocket):
                    self.subscribers[task_id].add(websocket)

                def unsubscribe(self, task_id, websocket):
                    self.subscribers[task_id].discard(websocket)

                async def close_task(self, task_id):
                    for websocket in self.subscribers[task_id]:  # expect: INV140
                        await websocket.close()
        '''),
        Invalid('''
            import asyncio

            streams = {}


            async def generate(request_id, engine, prompt):
                streams[request_id] = asyncio.Queue()
                try:
                    async for token in engine.stream(prompt):
                        await streams[request_id].put(token)
                finally:
                    del streams[request_id]


            async def flush_all():
                for request_id, queue in streams.items():  # expect: INV140
                    await queue.put(None)
        '''),
        Invalid('''
            from dataclasses import dataclass, field


            @dataclass
            class Room:
                listeners: set = field(default_factory=set)

                def join(self, websocket):
                    self.listeners.add(websocket)

                def leave(self, websocket):
                    self.listeners.discard(websocket)

                async def say(self, text):
                    for websocket in self.listeners:  # expect: INV140
                        await websocket.send_text(text)
        '''),
    ]
    VALID = [
        Valid('''
            from collections import defaultdict


            class Notifier:
                def __init__(self):
                    self.subscribers = defaultdict(set)

                def subscribe(self, task_id, websocket):
                    self.subscribers[task_id].add(websocket)

                def unsubscribe(self, task_id, websocket):
                    self.subscribers[task_id].discard(websocket)

                async def close_task(self, task_id):
                    for websocket in list(self.subscribers[task_id]):
                        await websocket.close()
        '''),
        Valid('''
            import asyncio

            streams = {}


            async def generate(request_id, engine, prompt):
                streams[request_id] = asyncio.Queue()
                try:
                    async for token in engine.stream(prompt):
                        await streams[request_id].put(token)
                finally:
                    del streams[request_id]


            async def flush_all():
                for request_id, queue in list(streams.items()):
                    await queue.put(None)
        '''),
        # Replacing or deleting an entry of the dict leaves the set the loop walks as it is.
        Valid('''
            class Notifier:
                def __init__(self):
                    self.subscribers: dict[str, set] = {}

                def open_task(self, task_id):
                    self.subscribers[task_id] = set()

                def close_task(self, task_id):
                    del self.subscribers[task_id]

                async def notify(self, task_id, text):
                    for websocket in self.subscribers[task_id]:
                        await websocket.send_text(text)
        '''),
        # A list: a change during the await skips or repeats an element, and raises nothing (known problems).
        Valid('''
            class Broadcaster:
                def __init__(self):
                    self.connections = []

                def connect(self, websocket):
                    self.connections.append(websocket)

                def disconnect(self, websocket):
                    self.connections.remove(websocket)

                async def broadcast(self, text):
                    for websocket in self.connections:
                        await websocket.send_text(text)
        '''),
    ]

    def __init__(self, ctx, options):
        super().__init__(ctx, options)
        self.kinds: dict[str, str] = {}  # "self.x" in a class (keyed "Class:self.x") or a module name -> set/dict
        self.changes: dict[str, list[str]] = {}  # the same keys -> the functions that change the container
        # a loop, its container's key and text, its function, and whether it iterates one entry of a dict
        self.loops: list[tuple[cst.For, str, str, str, bool]] = []
        self.functions: list[cst.FunctionDef] = []
        self.classes: list[str] = []

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self.classes.append(node.name.value)

    def leave_ClassDef(self, node: cst.ClassDef) -> None:
        self.classes.pop()

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.functions.append(node)

    def leave_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.functions.pop()

    def _key(self, text: str | None) -> str | None:
        """The key of a container this file shares: `Class:self.x` for an attribute, the name for a global."""
        if text is None:
            return None
        if text.startswith("self.") and text.count(".") == 1:
            return f"{self.classes[-1]}:{text}" if self.classes else None
        return text if "." not in text else None

    def visit_Assign(self, node: cst.Assign) -> None:
        for target in node.targets:
            self._assigned(target.target, node.value, None)

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        self._assigned(node.target, node.value, node.annotation.annotation)

    def _assigned(self, target: cst.BaseExpression, value: cst.BaseExpression | None,
                  annotation: cst.BaseExpression | None) -> None:
        text = dotted(target)
        if text is not None and "." not in text and self.classes and not self.functions:
            text = f"self.{text}"  # a class-body field (a dataclass's `subscribers: set = field(...)`)
        shared = (text or "").startswith("self.") or not self.functions
        kind = _kind(value, annotation, self.ctx.resolve)
        key = self._key(text) if shared else None
        if key is not None and kind is not None:
            self.kinds.setdefault(key, kind)
        if isinstance(target, cst.Subscript):  # `c[k] = v` changes a dict
            self._changed(dotted(target.value))

    def visit_Del(self, node: cst.Del) -> None:
        for item in ([e.value for e in node.target.elements] if isinstance(node.target, cst.Tuple) else [node.target]):
            if isinstance(item, cst.Subscript):
                self._changed(dotted(item.value))

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        if isinstance(func, cst.Attribute) and func.attr.value in _MUTATORS:
            if isinstance(func.value, cst.Subscript):  # `c[k].discard(x)`: one entry's set changes
                self._changed(dotted(func.value.value), entry=True)
            else:
                self._changed(dotted(func.value))

    def _changed(self, text: str | None, entry: bool = False) -> None:
        key = self._key(text)
        if key is not None and self.functions:
            self.changes.setdefault(f"{key}[]" if entry else key, []).append(self.functions[-1].name.value)

    def visit_For(self, node: cst.For) -> None:
        fn = self.functions[-1] if self.functions else None
        if fn is None or fn.asynchronous is None or node.asynchronous is not None:
            return
        container = node.iter
        if isinstance(container, cst.Call) and isinstance(container.func, cst.Attribute) \
                and container.func.attr.value in _VIEWS and not container.args:
            container = container.func.value
        entry = isinstance(container, cst.Subscript)
        text = dotted(container.value if isinstance(container, cst.Subscript) else container)
        key = self._key(text)
        if key is None or not _suspends(node):
            return
        self.loops.append((node, key, f"{text}[...]" if entry else text, fn.name.value, entry))  # type: ignore[arg-type]

    def end(self) -> None:
        for loop, key, text, function, entry in self.loops:
            kind = self.kinds.get(key)
            if kind is None or (entry and kind != "dict of sets"):
                continue
            changers = [name for name in self.changes.get(f"{key}[]" if entry else key, []) if name != function]
            if not changers:
                continue
            shown = "a set" if kind == "set" or entry else "a dict"
            self.ctx.report(self.id, loop, self.message.format(
                container=text, kind=shown, changer=f"{changers[0]}()",
                what="Set" if shown == "a set" else "dictionary"))


def _kind(value: cst.BaseExpression | None, annotation: cst.BaseExpression | None, resolve) -> str | None:
    """"set", "dict", or "dict of sets" (`defaultdict(set)`, `dict[str, set[...]]`), when the value or the
    annotation says so."""
    if isinstance(value, cst.Set | cst.SetComp):
        return "set"
    if isinstance(value, cst.Dict | cst.DictComp):
        return _annotated(annotation, resolve) or "dict"
    if isinstance(value, cst.Call):
        made = resolve(value.func) or dotted(value.func)
        if made in _SETS:
            return "set"
        if made in _DICTS:
            first = value.args[0].value if value.args else None
            if made == "collections.defaultdict" and first is not None and (resolve(first) or dotted(first)) in _SETS:
                return "dict of sets"
            return _annotated(annotation, resolve) or "dict"
    return _annotated(annotation, resolve) if value is None or annotation is not None else None


def _annotated(annotation: cst.BaseExpression | None, resolve) -> str | None:
    if annotation is None:
        return None
    base = annotation.value if isinstance(annotation, cst.Subscript) else annotation
    name = (resolve(base) or dotted(base) or "").rpartition(".")[2].lower()
    if name in ("set", "weakset"):
        return "set"
    if name in ("dict", "defaultdict", "ordereddict"):
        inner = annotation.slice[-1].slice if isinstance(annotation, cst.Subscript) and annotation.slice else None
        value = inner.value if isinstance(inner, cst.Index) else None
        value_base = value.value if isinstance(value, cst.Subscript) else value
        inner_name = (dotted(value_base) or "").rpartition(".")[2].lower() if value_base is not None else ""
        return "dict of sets" if inner_name in ("set", "weakset") else "dict"
    return None


def _suspends(loop: cst.For) -> bool:
    """The loop's body (not a def nested in it) awaits, or enters an `async for` or `async with`."""
    return any(isinstance(node, cst.Await) or (isinstance(node, cst.For | cst.With) and node.asynchronous is not None)
               for node in descendants(loop.body, stop=_FUNCTIONS))
