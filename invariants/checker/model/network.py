"""Sync HTTP calls: what INV137 follows from the event loop.

A sync HTTP client holds its thread until the other end answers, for as long as the other end
takes: a model registry's probe, an upstream's completion, a file download. On the event loop's
thread that is every request of the server standing still. flake8-async sees the module-level
calls (`requests.get`) and a client made in the same `async def`; the clients engines keep are
made once, in `__init__` (`self._client = httpx.Client(...)`), and called from a coroutine through
a sync method of another module, which is where the package model types and follows them.

A call is judged by the qualified name the summary gives its callee, receivers typed as
`collect.py` types them (an attribute its class assigns, a local, a `with httpx.Client() as
client:` target). Counted: the request functions of requests and httpx, `urllib.request.urlopen`,
and the request methods of the clients those libraries and urllib3 and http.client make. An
awaited call is an asyncio client's, never one of these.

Left out: subprocesses (on request paths of MLX servers nearly all are a `sysctl` probe of a few
milliseconds, model/waits.py), model hub downloads (a model load, which INV108 leaves to start-up
as it leaves loads), sockets (a server's own protocol code, where the loop's own transports are
used), and SDK clients built on these libraries (OpenAI's, Anthropic's): their methods are not
told apart from their data here.
"""

from __future__ import annotations

import ast

# The kind of the summary's entries for these calls (`Function.waits`), as a finding says it.
HTTP = "a sync HTTP call"

_VERBS = ("get", "post", "put", "patch", "delete", "head", "options", "request")
_FUNCTIONS = frozenset({*(f"requests.{v}" for v in _VERBS), *(f"httpx.{v}" for v in _VERBS), "httpx.stream",
                        "urllib.request.urlopen", "urllib3.request"})
# Constructors of sync clients, and the methods of theirs that talk to the other end.
_CLIENTS = {
    "requests.Session()": (*_VERBS, "send"),
    "requests.sessions.Session()": (*_VERBS, "send"),
    "requests.session()": (*_VERBS, "send"),
    "httpx.Client()": (*_VERBS, "stream", "send"),
    "urllib3.PoolManager()": ("request", "urlopen", "request_encode_body", "request_encode_url"),
    "http.client.HTTPConnection()": ("request", "getresponse", "connect"),
    "http.client.HTTPSConnection()": ("request", "getresponse", "connect"),
}
_CALLS = frozenset({*_FUNCTIONS, *(f"{client}.{method}" for client, methods in _CLIENTS.items() for method in methods)})
# The last names of the calls above: a call named otherwise is none of them, whatever its receiver.
_NAMES = frozenset(qual.rpartition(".")[2] for qual in _CALLS)
# The last names of the constructors: `with httpx.Client() as client:` binds the client itself.
CLIENT_CLASSES = frozenset(client[:-2].rpartition(".")[2] for client in _CLIENTS)


def named(call: ast.Call) -> bool:
    """`call`'s last name is one of the HTTP calls' (`get`, `post`, `stream`, `urlopen`, ...): worth typing its
    receiver."""
    func = call.func
    return (func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else "") in _NAMES


def calls_out(qual: str | None) -> bool:
    """The callee named `qual` is a sync HTTP call of the table."""
    return qual in _CALLS
