"""What each public MLX server of the zoo is: pinned, how it starts, what it answers on.

Data only, so a test can check every pin and template without installing anything. A
`Recipe` is a server that installs from the package index and serves the tiny local model
on Linux CPU MLX; a `Blocked` one is a server tried here that does not, with the error line
that stops it, so docs/zoo.md says why it is missing instead of leaving it out silently.

Command templates take `{venv}` (the recipe's venv folder), `{model}` (a local mlx-lm model
folder: weights cannot be downloaded here) and `{port}` (which `invariants fuzz
--server-cmd` fills in). Every server binds 127.0.0.1 only. A recipe with an `engine`
(MODULE:FACTORY) is fuzzed in-process instead, by its venv's python, with mlx-invariants
installed into that venv from this checkout (without dependencies, next to `FUZZ_DEPS`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Optional

PIN = re.compile(r"^[A-Za-z0-9_.\-]+(\[[a-z0-9,\-]+\])?==[0-9][0-9A-Za-z.+\-]*$")
CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
_ROUTE_OF = {COMPLETIONS: "completions", CHAT: "chat"}
# What the fuzzer needs in an in-process recipe's venv besides the engine (the project's own
# `fuzz` extra would pull mlx-lm 0.32, which vllm-mlx excludes).
FUZZ_DEPS = ("hypothesis==6.170.17", "httpx==0.28.1", "pytest==9.2.0", "pytest-timeout==2.4.0",
             "libcst==1.9.0", "pathspec==1.1.1")


@dataclass(frozen=True)
class Known:
    """A bug a standalone reproducer shows on this recipe, whether or not the fuzzer finds it.

    `script` is a file of `reproducers/`; `args` go before `--` and the server command.
    The script exits 1 when the bug shows, 0 when it does not, 2 when inconclusive.
    A fuzzer finding by one of `oracles` on this recipe is checked with this reproducer.
    `engine_api`: the script drives the server package's engine in-process (by the recipe's
    venv python, no server command), as every reproducer of an in-process recipe does; an HTTP
    recipe uses it where the bug a server shows lies in its engine.
    `gone`: "stream" or "nonstream" where the script checks only a client of that kind that
    went away; a finding is then checked with it only if its scenario has such a client.
    """

    slug: str
    title: str
    script: str
    args: tuple[str, ...]            # "{model}" is replaced by the model folder
    oracles: tuple[str, ...]
    engine_api: bool = False
    gone: str = ""


@dataclass(frozen=True)
class Recipe:
    name: str
    package: str
    version: str
    requirements: tuple[str, ...]        # every one pinned with ==; installed together
    command: str                         # template with {venv}, {model}, {port}; "" for an in-process recipe
    model_name: str                      # the "model" field the server accepts
    ready_path: str                      # answers (< 500) once the model is loaded
    endpoints: tuple[str, ...]           # the OpenAI routes it serves
    engine: str = ""                     # MODULE:FACTORY: fuzzed in-process by the venv's python
    venv: str = ""                       # venv folder name; recipes of one package share one
    overrides: tuple[str, ...] = ()      # uv --override lines (a dependency's pin replaced)
    # Requests it holds at once (slots and queue), where it is small enough for a scenario to exceed
    # (`invariants fuzz --capacity`); None: unknown to the fuzzer, or a queue too long to fill.
    capacity: Optional[int] = None
    notes: str = ""
    known: tuple[Known, ...] = field(default=())
    # (oracle, why): a finding this server's fuzzing gives that no reproducer can show, and why not
    why_unconfirmed: tuple[tuple[str, str], ...] = ()

    @property
    def in_process(self) -> bool:
        return bool(self.engine)

    @property
    def routes(self) -> str:
        """The endpoints as `invariants fuzz --routes` names them ("completions,chat")."""
        return ",".join(_ROUTE_OF[e] for e in self.endpoints)

    @property
    def venv_name(self) -> str:
        return self.venv or f"{self.package}-{self.version}"

    def server_command(self, venv: str, model: str) -> str:
        """The command for `invariants fuzz --server-cmd`: {port} is left for the fuzzer."""
        return self.command.replace("{venv}", venv).replace("{model}", model)


@dataclass(frozen=True)
class Blocked:
    """A server tried here that does not run on Linux CPU MLX, and the line that says why."""

    name: str
    package: str
    version: str
    reason: str
    error: str


SSE_SWALLOW = ("Where it comes from, read in vllm-mlx's source: `vllm_mlx.server._ensure_sse_terminal`, the "
               "wrapper of every streamed answer, yields the terminal `[DONE]` frame in a `finally`, so a "
               "CancelledError delivered to the task reading the stream (the server's own disconnect guard "
               "cancels it) becomes a normal `[DONE]` frame. SimpleEngine's own stream lets the cancel through "
               "(`vllm_stream_swallows_cancel.py --engine simple` exits 0). The wrapper is private and the "
               "cancelled task is the server's own, so neither HTTP nor vllm-mlx's public API shows it, and a "
               "reproducer here may use only those.")
FINALIZED_ONCE = ("Rare: see its replay rate. The sentinel saw a cancelled or disconnected stream's mlx-lm generator, "
                  "made and stepped on SimpleEngine's generation thread, finalized (its `finally` and MLX stream "
                  "exits run) on the event-loop thread, from `vllm_mlx/models/llm.py` `stream_generate`. A script "
                  "that streams a chat answer and, after 5 outputs, closes the stream or cancels its reader (20 "
                  "tries each, short and long prompts, one request at a time) did not show it: the fuzzer's "
                  "scenarios had other requests around it, refused as busy. So it stays unconfirmed.")
STREAM_SWALLOWS_CANCEL = ("a stream swallows the CancelledError of the task reading it (`EngineCore.stream_outputs` "
                          "catches it and ends): a cancelled reader returns normally, and a read cut by "
                          "`asyncio.timeout` ends as if the answer were complete, with no TimeoutError")

RECIPES: tuple[Recipe, ...] = (
    Recipe(
        name="mlx-lm",
        package="mlx-lm",
        version="0.32.2",
        requirements=("mlx-lm==0.32.2", "mlx[cpu]==0.32.4"),
        command="{venv}/bin/mlx_lm.server --model {model} --host 127.0.0.1 --port {port}",
        model_name="default_model",
        ready_path="/v1/models",
        endpoints=(COMPLETIONS, CHAT),
        notes="`mlx_lm.server`: a ThreadingHTTPServer in front of one generation thread that batches requests.",
        known=(Known("gone-nonstream", "keeps decoding every token for a non-streaming client that has gone",
                     "gone_client_keeps_decoding.py",
                     ("--model", "default_model", "--tokens", "1500", "--mode", "nonstream"),
                     ("abort-ignored", "compute-after-disconnect"), gone="nonstream"),
               Known("cached-prompt-kills-generation", "a prompt that the prompt cache holds whole (a cancelled "
                     "stream's prompt less its last word) kills the generation thread (\"Sequence N has an empty "
                     "prompt\"); every later request fails with HTTP 404 \"generation thread died\"",
                     "cached_prompt_kills_generation.py", ("--model", "default_model"),
                     ("followup-differs", "request-crashed"))),
        why_unconfirmed=(("compute-after-disconnect",
                          "Without the harness mlx-lm stops a streaming request whose client has gone at its next "
                          "write: `gone_client_keeps_decoding.py --mode stream` with `--leave-s 0.02` or the default "
                          "exits 0 (the server idle within a quarter second, 1-2% of the full request's CPU). The "
                          "oracle's bound is a few decode steps (at least 0.25 s), which a heavily loaded machine's "
                          "scheduling can exceed, and this finding's replay rate says how steadily it showed."),),
    ),
    Recipe(
        name="vllm-mlx",
        package="vllm-mlx",
        version="0.6.0",
        requirements=("vllm-mlx==0.6.0", "mlx[cpu]==0.32.4"),
        command="{venv}/bin/vllm-mlx serve {model} --served-model-name tiny --host 127.0.0.1 --port {port}",
        model_name="tiny",
        ready_path="/health",
        endpoints=(COMPLETIONS, CHAT),
        notes="Default mode: `SimpleEngine`, one request at a time; a second concurrent request gets "
              "\"serialized route is busy\" as an error frame inside an HTTP 200 stream.",
        capacity=1,
        known=(Known("gone-nonstream", "keeps decoding every token for a non-streaming client that has gone",
                     "gone_client_keeps_decoding.py",
                     ("--model", "tiny", "--tokens", "1500", "--mode", "nonstream"),
                     ("abort-ignored", "compute-after-disconnect"), gone="nonstream"),
               Known("cancelled-stream-blocks-next", "after a client cancels a streaming request, the next "
                     "request gets HTTP 200 with an \"Internal server error\" frame and no text (the engine still "
                     "counts the cancelled request as running: \"SimpleEngine serialized route is busy\")",
                     "cancelled_stream_then_followup.py", ("--model", "tiny"), ("followup-differs",)),
               Known("usage-over-max", "non-streaming chat reports more completion tokens than max_tokens "
                     "(it re-encodes the decoded text to count them)",
                     "usage_over_max_tokens.py", ("--model", "tiny", "--routes", "chat"), ())),
        why_unconfirmed=(("cancel-swallowed", SSE_SWALLOW), ("mlx-finalized-off-thread", FINALIZED_ONCE)),
    ),
    Recipe(
        name="vllm-mlx-batched",
        package="vllm-mlx",
        version="0.6.0",
        requirements=("vllm-mlx==0.6.0", "mlx[cpu]==0.32.4"),
        command="{venv}/bin/vllm-mlx serve {model} --served-model-name tiny --continuous-batching "
                "--host 127.0.0.1 --port {port}",
        model_name="tiny",
        ready_path="/health",
        endpoints=(COMPLETIONS, CHAT),
        notes="`--continuous-batching`: `BatchedEngine` on mlx-lm's BatchGenerator.",
        known=(Known("stream-swallows-cancel", STREAM_SWALLOWS_CANCEL, "vllm_stream_swallows_cancel.py",
                     ("--model", "{model}", "--engine", "batched"), ("cancel-swallowed",), engine_api=True),),
    ),
    Recipe(
        name="mlx-openai-server",
        package="mlx-openai-server",
        version="1.8.1",
        requirements=("mlx-openai-server==1.8.1", "mlx[cpu]==0.31.2"),
        # mflux (image generation, optional at run time) pins mlx[cuda13] on Linux, which has no
        # CPU build: without the override the install fails to resolve.
        overrides=("mlx[cpu]==0.31.2",),
        command="{venv}/bin/mlx-openai-server launch --model-path {model} --model-type lm "
                "--served-model-name tiny --no-log-file --host 127.0.0.1 --port {port}",
        model_name="tiny",
        ready_path="/health",
        endpoints=(CHAT,),
        notes="Chat only: `/v1/completions` answers 404, so it is fuzzed with `--routes chat` (its requests and "
              "the follow-up take the chat route).",
        why_unconfirmed=(("mlx-off-owner",
                          "The sentinel saw MLX entered on the model worker process's `mlx-batch-scheduler` thread "
                          "after another thread of that process had entered it first (the owner is the first thread "
                          "to enter; the scheduler thread starts lazily, at the first request, after the model is "
                          "loaded). On Linux CPU MLX no failure follows from that which a script could show without "
                          "the harness: it could only show which thread runs MLX, the fact itself."),),
    ),
)

IN_PROCESS: tuple[Recipe, ...] = tuple(
    Recipe(
        name=f"vllm-mlx-{kind}-inproc",
        package="vllm-mlx",
        version="0.6.0",
        requirements=("vllm-mlx==0.6.0", "mlx[cpu]==0.32.4") + FUZZ_DEPS,
        command="",
        model_name="",
        ready_path="",
        endpoints=(),
        engine=f"zoo.vllm_engines:{kind}",
        venv="vllm-mlx-0.6.0-inproc",
        notes=f"`vllm_mlx.engine.{cls}` fuzzed in-process through its public API (`zoo/vllm_engines.py`): "
              "no HTTP server; faults land at the points a caller sees (handed over, each output).",
        known=known,
        why_unconfirmed=((("mlx-finalized-off-thread", FINALIZED_ONCE),) if kind == "simple" else
                         (("stray-task", "Its shrunk scenario is the `shutdown-left-waiter` one above, and so is the "
                           "task left pending: the request stop() stranded. The reproducer of that finding "
                           "(`vllm_batched_stop_strands_request.py`) shows the request still waiting 10 s after "
                           "stop(); this run linked reproducers by oracle before `stray-task` was added to it, "
                           "so this entry is left unconfirmed rather than relabelled by hand."),)),
    )
    for kind, cls, known in (
        ("simple", "SimpleEngine",
         (Known("double-cancel-slot", "a stream cancelled twice frees the generation slot while its step still "
                "runs on the generation thread", "vllm_simple_double_cancel.py", ("--model", "{model}"),
                ("lock-released-early",)),)),
        ("batched", "BatchedEngine",
         (Known("stop-strands-request", "stop() leaves a request that was just handed to the engine waiting forever",
                "vllm_batched_stop_strands_request.py", ("--model", "{model}"),
                ("shutdown-left-waiter", "stray-task")),
          Known("stream-swallows-cancel", STREAM_SWALLOWS_CANCEL, "vllm_stream_swallows_cancel.py",
                ("--model", "{model}", "--engine", "batched"), ("cancel-swallowed",), engine_api=True))),
    )
)

BLOCKED: tuple[Blocked, ...] = (
    Blocked(
        name="mlx-omni-server",
        package="mlx-omni-server",
        version="0.5.3",
        reason="Installs only with mlx[cuda13] overridden (its mflux dependency pins the CUDA build on "
               "Linux); then it cannot start without the network: at import it downloads the spaCy "
               "model en_core_web_sm (for text-to-speech), which is not on the package index.",
        error="requests.exceptions.ConnectionError: HTTPSConnectionPool(host='raw.githubusercontent.com', "
              "port=443): Max retries exceeded with url: /explosion/spacy-models/master/compatibility.json",
    ),
    Blocked(
        name="fastmlx",
        package="fastmlx",
        version="0.2.1",
        reason="Written against mlx-lm < 0.21: with today's mlx-lm its guarded imports fail and it dies at "
               "start; pinned to mlx-lm 0.20.6 / mlx 0.21.1 it answers non-streaming chat only, and every "
               "streamed answer needs Metal (mlx-lm 0.20's wired_limit); it has no /v1/completions.",
        error="RuntimeError: [metal::device_info] Cannot get device info without metal backend",
    ),
)


ALL: tuple[Recipe, ...] = RECIPES + IN_PROCESS


def find(name: str) -> Recipe:
    for recipe in ALL:
        if recipe.name == name:
            return recipe
    raise KeyError(f"no zoo recipe named {name!r}; known: {', '.join(r.name for r in ALL)}")
