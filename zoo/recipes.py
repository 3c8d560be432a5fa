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
class Report:
    """A bug as its upstream report says it: facts a maintainer can check, in the server's own terms.

    `source` entries are "path:line: what that code does", paths inside the installed package at the
    pinned version. `upstream` says whether upstream has fixed it and where that was looked up.
    """

    headline: str                 # the cause, in the server's terms
    affected: str                 # the versions shown affected (and what else is known)
    happens: str                  # what a client sees
    should: str                   # what it should see instead
    source: tuple[str, ...]
    upstream: str


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
    report: Optional[Report] = None


@dataclass(frozen=True)
class Recipe:
    name: str
    package: str
    version: str
    requirements: tuple[str, ...]        # every one pinned with ==; installed together
    command: str                         # template with {venv}, {model}, {port}; "" for an in-process recipe
    model_name: str                      # the "model" field the server accepts ("{model}": the model folder)
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
    # (oracle, why): a finding of this server that reading its code, or the fuzzer's, showed to be wrong (a false alarm)
    false_alarms: tuple[tuple[str, str], ...] = ()

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

    def model_field(self, model: str) -> str:
        """The "model" field of a request (`invariants fuzz --model`), for the model folder `model`."""
        return self.model_name.replace("{model}", model)

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
# What is known of a launched server's `rest-drift` that never replayed (fuzz/rest.py): kept apart from a leak.
REST_DRIFT_UNREPLAYED = ("Never replayed: the same scenario again and again on a freshly started server did not climb "
                         "(the replay rate above). What was seen (MLX active memory up a few megabytes over the "
                         "first scenarios, then judged) is also what a prompt or prefix cache filling looks like, "
                         "which the oracle cannot tell from a leak over nine scenarios (its known problem); no "
                         "leak has been shown, so it is not reported as one.")
REST_DRIFT_THREADS = ("Never replayed on a freshly started server (the replay rate above). A thread count climbing "
                      "over the first scenarios is also what a pool growing to its size looks like; no leak has "
                      "been shown, so it is not reported as one.")
FINALIZED_ONCE = ("Rare: see its replay rate. The sentinel saw a cancelled or disconnected stream's mlx-lm generator, "
                  "made and stepped on SimpleEngine's generation thread, finalized (its `finally` and MLX stream "
                  "exits run) on the event-loop thread, from `vllm_mlx/models/llm.py` `stream_generate`. A script "
                  "that streams a chat answer and, after 5 outputs, closes the stream or cancels its reader (20 "
                  "tries each, short and long prompts, one request at a time) did not show it: the fuzzer's "
                  "scenarios had other requests around it, refused as busy. So it stays unconfirmed.")
STREAM_SWALLOWS_CANCEL = ("a stream swallows the CancelledError of the task reading it (`EngineCore.stream_outputs` "
                          "catches it and ends): a cancelled reader returns normally, and a read cut by "
                          "`asyncio.timeout` ends as if the answer were complete, with no TimeoutError")

VLLM_BATCHED_POLL = ("Without the harness the batched server stops a request soon after its client has gone: "
                     "`gone_client_keeps_decoding.py --tokens 1500` exits 0 for both `--mode nonstream` and `--mode "
                     "stream`, each with `--leave-s 0.02`, `0.3` and the default (six runs, 2026-11-27, load about "
                     "1): a streaming request is idle at once, a non-streaming one 0.26 to 0.52 s after the client "
                     "left (1 to 3 % of the full request's CPU). That half second is the server's poll: a "
                     "non-streaming request's connection is looked at every 0.5 s (`_wait_with_disconnect`, "
                     "vllm_mlx/server.py:5512 and 5531), and once it is gone the engine task is cancelled (5583), "
                     "whose `generate` aborts the request (vllm_mlx/engine_core.py:679). The oracle's bound is 8 "
                     "decode steps; at the fuzzer's pace with the sentinel the poll alone is about 17 (the finding "
                     "saw 16.7). A delay bounded by a poll interval, not decoding on to max_tokens, so it is not "
                     "reported as a bug.")

NEWEST = "the newest release on the package index when this zoo ran"
MLX_LM_SNAPSHOT = ("the stored upstream snapshot (ml-explore/mlx-lm d78bf58e, 2026-08-22) predates 0.32.2, so "
                   "nothing newer than the release could be read")
VLLM_SNAPSHOT = ("the stored upstream snapshot (waybarrios/vllm-mlx 4b654c09, 2026-08-22) predates 0.6.0, so "
                 "nothing newer than the release could be read")

MLX_LM_GONE = Report(
    headline="mlx_lm.server: a non-streaming request decodes to max_tokens after its client has gone "
             "(nothing is written to the socket until the last token, so the disconnect is never seen)",
    affected="mlx-lm 0.32.2 (" + NEWEST + "); streaming requests are not affected (their next write fails)",
    happens="the client closes its connection a tenth of the way into a 1500-token non-streaming chat "
            "completion; the server keeps decoding to the end, spending about the full request's CPU again for nobody, and holds "
            "its batch slot meanwhile",
    should="stop the request within a decode step or two of the disconnect, as it does for a streaming request",
    source=("mlx_lm/server.py:1611: `for gen in response:` consumes every token of the request",
            "mlx_lm/server.py:1589: a non-streaming request sets its headers and writes nothing while it decodes",
            "mlx_lm/server.py:1715: the answer is written once, after the last token: the first point at which a "
            "closed socket could be noticed"),
    upstream="not fixed in 0.32.2; PR ml-explore/mlx-lm#677 (closed unmerged) stopped only streaming requests on "
             "disconnect; no issue for the non-streaming case found in the tracker search; " + MLX_LM_SNAPSHOT,
)

MLX_LM_CACHED = Report(
    headline="mlx_lm.server: a prompt the prompt cache holds whole leaves no token to prefill; "
             "`BatchGenerator` raises \"Sequence N has an empty prompt\" on the generation thread, which dies, "
             "and every later request gets HTTP 404 \"generation thread died\"",
    affected="mlx-lm 0.32.2 (" + NEWEST + "); the same exact-hit class was reported against 0.31.3",
    happens="after a streamed request is cancelled, a request whose prompt the cache holds in full (here the "
            "cancelled prompt less its last word) is cut off with no response, the generation thread exits, and "
            "every later request, whatever its prompt, answers 404 until the server is restarted",
    should="an exact cache hit should re-process at least the last prompt token (or recompute the prompt); a "
           "failure in one request should fail that request only, not the generation thread",
    source=("mlx_lm/server.py:843: `fetch_nearest_cache` returns an exact hit with an empty remainder",
            "mlx_lm/server.py:847: the cached tokens are cut from the segments, leaving none",
            "mlx_lm/generate.py:1698: `ValueError(f\"Sequence {uid} has an empty prompt.\")` raised on the "
            "generation thread",
            "mlx_lm/server.py:542: `_run_generate` logs the exception and marks generation failed: the thread is gone",
            "mlx_lm/server.py:1577: each later request's `generate` raises \"generation thread died\", answered 404"),
    upstream="open: issue ml-explore/mlx-lm#1215 (the exact-hit class on 0.31.3, closed) and open fixes PR #1596 and "
             "PR #1887 (2026-09, trim one cached token on an exact hit); none is in 0.32.2; " + MLX_LM_SNAPSHOT,
)

VLLM_GONE = Report(
    headline="vllm-mlx SimpleEngine: a non-streaming chat request keeps decoding to max_tokens after its client "
             "disconnects: the server notices and cancels the task, but `_run_blocking_serialized` runs "
             "`model.chat` as one blocking call with no abort hook and waits for it",
    affected="vllm-mlx 0.6.0 (" + NEWEST + "), default SimpleEngine",
    happens="the client closes its connection a tenth of the way into a 1500-token non-streaming chat; the "
            "server logs the disconnect, yet decodes every remaining token, about the full request's CPU, while "
            "holding the generation slot (a new request meanwhile is refused as busy)",
    should="the disconnect should stop the decode within a step or two and free the slot",
    source=("vllm_mlx/server.py:5566: `_wait_with_disconnect` sees the disconnect and cancels the engine task",
            "vllm_mlx/engine/simple.py:1680: a text model's non-streaming chat runs "
            "`_run_blocking_serialized(self._model.chat, ...)` without `on_cancel`",
            "vllm_mlx/models/llm.py:205: mlx-lm's `generate()` produces the whole answer in one call, with no way "
            "to stop it",
            "vllm_mlx/engine/simple.py:1153: on cancel the runner awaits the worker to the end before it lets go"),
    upstream="not fixed in 0.6.0; the missing abort path (\"on_cancel=None\" for the non-streaming chat route) was "
             "pointed out in a review of waybarrios/vllm-mlx PR #679 (2026-08); no issue or fix found; "
             + VLLM_SNAPSHOT,
)

VLLM_BUSY_STREAM = Report(
    headline="vllm-mlx SimpleEngine: a streaming request refused as busy (EngineBusy, fail_fast admission) is "
             "answered HTTP 200 with a generic \"Internal server error\" frame; a non-streaming one gets 503",
    affected="vllm-mlx 0.6.0 (" + NEWEST + "), default SimpleEngine with the default "
             "VLLM_MLX_SIMPLE_ENGINE_LOCK_ADMISSION=fail_fast",
    happens="a client closes a streaming completion as soon as its headers arrive; a streaming request sent right "
            "after it reaches the engine while the cancelled request still holds the generation slot and is refused "
            "as busy; the window is short (resent every 10 ms, the same request was answered 0.06 to 0.5 s after "
            "it was first sent, the longer times on a machine with a load average of 9); "
            "the refusal comes after the 200 headers, so the client gets HTTP 200, an error frame "
            "{\"message\": \"Internal server error\", \"code\": 500} and no text; nothing stays blocked",
    should="the busy refusal should reach a streaming client as it reaches a non-streaming one: HTTP 503 with the "
           "retryable busy message (admission checked before the stream's headers are sent), or at least an error "
           "frame that says busy / retry rather than an internal error",
    source=("vllm_mlx/engine/simple.py:739: fail_fast admission raises `EngineBusy` whenever the generation lock "
            "is held",
            "vllm_mlx/engine/simple.py:1554: a cancelled stream keeps the slot until its generator's close has run "
            "on the generation worker",
            "vllm_mlx/server.py:5184: `_ensure_sse_terminal` turns an exception raised inside the stream (after the "
            "200 headers) into an error frame",
            "vllm_mlx/server.py:1198: `_stream_error_payload` reports anything but an HTTPException as code 500 "
            "\"Internal server error\"",
            "vllm_mlx/server.py:6003: the non-streaming chat route maps `EngineBusy` to 503 (`_raise_engine_busy`, "
            "server.py:1231)"),
    upstream="not fixed in 0.6.0; no issue about busy streams answered as internal errors found in the tracker "
             "search; " + VLLM_SNAPSHOT,
)

VLLM_USAGE = Report(
    headline="vllm-mlx SimpleEngine: non-streaming chat `usage.completion_tokens` counts the decoded text "
             "re-encoded, not the tokens generated, and can exceed max_tokens",
    affected="vllm-mlx 0.6.0 (" + NEWEST + "), default SimpleEngine; BatchedEngine counts the generated tokens",
    happens="a non-streaming chat with max_tokens N reports completion_tokens > N (and its finish_reason is decided "
            "from the same count)",
    should="count the tokens the model generated (at most max_tokens)",
    source=("vllm_mlx/models/llm.py:216: `tokens = self.tokenizer.encode(output_text)` after generation",
            "vllm_mlx/models/llm.py:219: finish_reason from that re-encoded count",
            "vllm_mlx/engine/simple.py:1706: `completion_tokens=len(output.tokens)` reported as usage"),
    upstream="not fixed in 0.6.0; no issue found in the tracker search; " + VLLM_SNAPSHOT,
)

VLLM_SWALLOW = Report(
    headline="vllm-mlx EngineCore.stream_outputs catches CancelledError and ends the stream normally: a cancelled "
             "reader returns as if done, and `asyncio.timeout` around a read never raises TimeoutError",
    affected="vllm-mlx 0.6.0 (" + NEWEST + "), BatchedEngine (`--continuous-batching`)",
    happens="a caller reads `BatchedEngine.stream_generate` under `asyncio.timeout(0.5)`; when the time is up the "
            "stream just ends, its last output unfinished, and no TimeoutError reaches the caller",
    should="let the CancelledError propagate after the cleanup (abort the request in a finally), so cancellation "
           "and timeouts work for the caller",
    source=("vllm_mlx/engine_core.py:601: `except (GeneratorExit, asyncio.CancelledError)` logs and does not "
            "re-raise",),
    upstream="not fixed in 0.6.0; no issue found in the tracker search; " + VLLM_SNAPSHOT,
)

VLLM_DOUBLE_CANCEL = Report(
    headline="vllm-mlx SimpleEngine.stream_generate: a second cancel, landing in the `finally` that awaits the "
             "generator's close on the worker, releases the generation slot while the cancelled step still runs",
    affected="vllm-mlx 0.6.0 (" + NEWEST + ")",
    happens="a stream cancelled twice during its prefill ends; `get_stats()` reports nothing running and a new "
            "request is admitted, while the generation thread is still inside mlx-lm's generation for the "
            "cancelled request",
    should="the slot should stay held until the worker has finished the cancelled step and the close (shield the "
           "cleanup, as `_run_blocking_serialized` does for its own worker task)",
    source=("vllm_mlx/engine/simple.py:1434: `async with self._acquire_generation_slot(request_id)` holds the slot",
            "vllm_mlx/engine/simple.py:1487: each step is awaited on the generation worker",
            "vllm_mlx/engine/simple.py:1561: the `finally` awaits `iterator.close` on the worker unshielded; a "
            "second cancel there unwinds the slot"),
    upstream="not fixed in 0.6.0; no issue found in the tracker search; " + VLLM_SNAPSHOT,
)

VLLM_STOP = Report(
    headline="vllm-mlx EngineCore.stop() cancels the engine loop without finishing the requests it holds: a "
             "`generate()` handed in just before waits on its finished event forever",
    affected="vllm-mlx 0.6.0 (" + NEWEST + "), BatchedEngine",
    happens="`generate()` is called on a started engine and `stop()` right after it; `stop()` returns and the "
            "request is still waiting 10 s later (indefinitely)",
    should="after stop() every request ends, with its answer or an error that says the engine stopped",
    source=("vllm_mlx/engine_core.py:171: `stop()` cancels the loop task and closes the batch generator; no "
            "request's finished event or output collector is completed",
            "vllm_mlx/engine_core.py:657: `generate()` awaits `event.wait()` with no timeout"),
    upstream="not fixed in 0.6.0; no issue found in the tracker search; " + VLLM_SNAPSHOT,
)

MOS_SNAPSHOT = ("the stored upstream snapshot (cubist38/mlx-openai-server 4b7d4b61, v1.8.1 + 4 commits, 2026-05-14) "
                "has the same code")

MOS_GONE_NONSTREAM = Report(
    headline="mlx-openai-server: a non-streaming request keeps decoding in the model worker process after its "
             "client has gone: `HandlerProcessProxy._call` sends no cancel to the worker, which awaits the whole "
             "generation",
    affected="mlx-openai-server 1.8.1 (" + NEWEST + "), `--model-type lm` with its default batch scheduler",
    happens="the client closes its connection a tenth of the way into a 1500-token non-streaming chat; the model "
            "worker process decodes every remaining token (about the full request's CPU again, measured over the "
            "server's whole process tree) and keeps its batch slot",
    should="the disconnect should reach the worker (a cancel message, as `_call_stream` sends) and remove the "
           "request from the batch within a step or two",
    source=("app/core/handler_process.py:869: `_call` (non-streaming RPC) drops its pending entry when cancelled "
            "and sends nothing to the worker process",
            "app/core/handler_process.py:975: only `_call_stream` sends a cancel message on early exit",
            "app/core/handler_process.py:356: the worker process's non-streaming branch awaits the whole handler "
            "method, with no cancel check"),
    upstream="open: issue cubist38/mlx-openai-server#321 (2026-08-29) reports the same missing cancel for the "
             "non-batched `InferenceWorker.submit`; this is the batched (default) path through the handler "
             "process; not fixed in 1.8.1; " + MOS_SNAPSHOT,
)

MOS_GONE_STREAM = Report(
    headline="mlx-openai-server: a streaming request keeps decoding after its client has gone: the worker "
             "process's `_stream_until_cancelled` checks the cancel flag only when no chunk arrived within 0.1 s, "
             "so a model that yields a token faster than that is never stopped",
    affected="mlx-openai-server 1.8.1 (" + NEWEST + "), `--model-type lm` with its default batch scheduler",
    happens="the client closes a 1500-token streaming chat a tenth of the way in; the parent sends the cancel, "
            "but the worker process keeps taking chunks (each arrives within the 0.1 s poll) and decodes to the "
            "end, about the full request's CPU again (121 % and 130 % in two runs here); in a third run, on a "
            "machine with a load average of 8, it stopped after 38 % of it, once a chunk came late enough for the "
            "poll to see the cancel: how long it goes on depends on how fast tokens come",
    should="check the cancel flag after every chunk as well, and close the stream (which sets the batch "
           "scheduler's cancel_event) as soon as it is set",
    source=("app/core/handler_process.py:85: each chunk is awaited with a 0.1 s timeout; one that arrives in time "
            "is yielded (89) and the loop goes on without looking at the cancel flag",
            "app/core/handler_process.py:91: `should_cancel()` is consulted only on that timeout",
            "app/core/batch_scheduler.py:431: the request's cancel_event is set only when its stream is closed"),
    upstream="not fixed in 1.8.1: issue #269 / PR #270 (merged 2026-04) added a cancel to the non-batched "
             "`InferenceWorker.submit_stream` and PR #255 (2026-03) the parent's cancel message; the worker "
             "process's chunk loop was not changed; no issue found for it; " + MOS_SNAPSHOT,
)

MOS_STOP = Report(
    headline="mlx-openai-server: a `stop` sequence is matched only as the token ids of its own encoding "
             "(`BatchScheduler.build_state_machine`), never in the decoded text, so one the model produces inside "
             "a longer token is not seen: the answer runs on and returns the stop sequence",
    affected="mlx-openai-server 1.8.1 (" + NEWEST + "), `--model-type lm` with its default batch scheduler, "
             "chat completions streamed and not",
    happens="a greedy chat answer repeats \" six\" (one token of the tiny model); asked again with stop [\"six\"] "
            "(encoded as \"si\" + \"x\") or [\"i\"], the whole answer comes back, holding the stop sequence, in "
            "all four requests (streamed and not); finish_reason is \"stop\" although the answer ran to max_tokens "
            "(40 of 40 tokens); a stop sequence that is exactly one of the answer's tokens (\" six\") does stop it",
    should="end the answer at the first occurrence of the stop sequence in the decoded text, whatever tokens carry "
           "it, and return the text before it (OpenAI's API reference for `stop`: the returned text will not "
           "contain the stop sequence; openai-python e43b4224, src/openai/types/chat/completion_create_params.py:296); "
           "an answer cut at max_tokens should say finish_reason \"length\"",
    source=("app/core/batch_scheduler.py:242: each stop word becomes `tokenizer.encode(stop_word)`, a sequence of "
            "token ids",
            "app/core/batch_scheduler.py:249: mlx-lm's `SequenceStateMachine` matches those id sequences against the "
            "generated ids only",
            "app/handler/mlx_lm.py:1296: the request's `stop` goes to that state machine alone; no decoded text is "
            "searched for it",
            "app/api/endpoints.py:962: a streamed answer's finish_reason starts as \"stop\" and only tool calls change "
            "it",
            "app/api/endpoints.py:1179: a non-streaming answer's finish_reason is \"stop\" whatever ended it"),
    upstream="not fixed in 1.8.1; no issue about stop sequences found in the tracker search; the same class (stop "
             "words matched as token ids only) was reported against mlx_lm.server in ml-explore/mlx-examples#524 "
             "(2024, closed); " + MOS_SNAPSHOT,
)

MLX_VLM_GONE = Report(
    headline="mlx_vlm.server: a non-streaming chat completion decodes to the end after its client has gone: "
             "`_blocking_generate` iterates the request's token iterator in a worker thread and closes it (which "
             "cancels the request) only after the last token",
    affected="mlx-vlm 0.7.10 (" + NEWEST + "), text-only chat with its default continuous batching; streaming "
             "requests close their iterator when the stream ends",
    happens="the client closes its connection a tenth of the way into a 900-token non-streaming chat; the server "
            "keeps decoding, spending most of the full request's CPU again, and the request keeps its batch slot",
    should="watch the connection (`http_request.is_disconnected()`) while the thread runs and close the token "
           "iterator on disconnect, as the streaming path's `finally` does",
    source=("mlx_vlm/server/openai.py:2561: `for token in token_iter:` reads every token, with no disconnect check",
            "mlx_vlm/server/openai.py:2573: `token_iter.close()`, the only cancel, runs after the loop",
            "mlx_vlm/server/openai.py:2585: the loop runs in `asyncio.to_thread`, which a cancelled handler "
            "cannot stop",
            "mlx_vlm/server/generation.py:986: `_TokenIterator.close()` cancels an unfinished request"),
    upstream="not fixed in 0.7.10; no issue found in the tracker search; the stored upstream snapshot "
             "(Blaizzy/mlx-vlm 9b13f522, 2026-08-22) predates 0.7.10 and has the same loop",
)

MLX_VLM = Recipe(
    name="mlx-vlm",
    package="mlx-vlm",
    version="0.7.10",
    requirements=("mlx-vlm==0.7.10", "mlx[cpu]==0.32.4"),
    command="{venv}/bin/mlx_vlm.server --model {model} --host 127.0.0.1 --port {port}",
    model_name="{model}",
    ready_path="/health",
    endpoints=(CHAT,),
    notes="`mlx_vlm.server` (FastAPI) with text-only chat requests on the tiny llama (mlx-vlm's own `llama` "
          "model class loads it). Chat only (`/v1/completions` answers 404); the \"model\" field a request "
          "names is the model folder it was started with (another name makes it load that model). The tiny "
          "llama's 1024-token context caps an answer at about 1000 tokens, so its reproducer asks for 900.",
    known=(Known("gone-nonstream", "keeps decoding every token for a non-streaming client that has gone",
                 "gone_client_keeps_decoding.py", ("--model", "{model}", "--tokens", "900", "--mode", "nonstream"),
                 ("abort-ignored", "compute-after-disconnect"), gone="nonstream", report=MLX_VLM_GONE),),
    why_unconfirmed=(("rest-drift", REST_DRIFT_THREADS),),
)

RAPID_MLX = Recipe(
    name="rapid-mlx",
    package="rapid-mlx",
    version="0.16.10",
    requirements=("rapid-mlx==0.16.10", "mlx[cpu]==0.32.4"),
    # Its usage reporting is on by default; off here (the machine has no network anyway).
    command="env RAPID_MLX_TELEMETRY=0 {venv}/bin/rapid-mlx serve {model} --served-model-name tiny "
            "--host 127.0.0.1 --port {port}",
    model_name="tiny",
    ready_path="/health",
    endpoints=(COMPLETIONS, CHAT),
    notes="Rapid-MLX, a fork of vllm-mlx (its package also installs a `vllm-mlx` command), in its default mode.",
    why_unconfirmed=(("rest-drift", REST_DRIFT_UNREPLAYED),),
)

VMLX = Recipe(
    name="vmlx",
    package="vmlx",
    version="1.6.81",
    # With the newest mlx-lm (0.32.2, which its `mlx-lm>=0.31.3` lets in) it dies at import:
    # "cannot import name 'SequenceStateMachine' from 'mlx_lm.generate'"; 0.31.3 has it.
    requirements=("vmlx==1.6.81", "mlx[cpu]==0.32.4", "mlx-lm==0.31.3"),
    command="{venv}/bin/vmlx serve {model} --served-model-name tiny --host 127.0.0.1 --port {port}",
    model_name="tiny",
    ready_path="/health",
    endpoints=(COMPLETIONS, CHAT),
    notes="vMLX's engine (`vmlx_engine`, another descendant of vllm-mlx) in its default mode (a batched engine). "
          "mlx-lm is pinned to 0.31.3: with 0.32.2 it fails at import (`SequenceStateMachine` is gone).",
)

MLX_DEV_SERVER = Recipe(
    name="mlx-dev-server",
    package="mlx-dev-server",
    version="0.1.2",
    # It asks for mlx-lm ~=0.28 on Apple silicon only, so nothing of MLX comes on Linux: pinned here. With mlx
    # 0.32 every generation fails ("There is no Stream(cpu, 0) in current thread"); 0.29.4 is of mlx-lm 0.28's time.
    requirements=("mlx-dev-server==0.1.2", "mlx-lm==0.28.4", "mlx[cpu]==0.29.4"),
    command="{venv}/bin/mlx_dev_server --host 127.0.0.1 --port {port}",
    model_name="{model}",
    # Nothing answers before a model is loaded (on its first request; /v1/models answers 500 without a Hugging
    # Face cache), so the path is one that answers 404 as soon as it listens.
    ready_path="/",
    endpoints=(COMPLETIONS, CHAT),
    notes="An aiohttp server that loads the model a request names (the model folder here) on first use and keeps "
          "up to two loaded. mlx-lm is pinned to 0.28.4 with mlx 0.29.4: its requirement names mlx-lm on "
          "Apple silicon only, and with mlx 0.32 generation fails (\"There is no Stream(cpu, 0) in current "
          "thread\").",
)

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
                     ("abort-ignored", "compute-after-disconnect"), gone="nonstream", report=MLX_LM_GONE),
               Known("cached-prompt-kills-generation", "a prompt that the prompt cache holds whole (a cancelled "
                     "stream's prompt less its last word) kills the generation thread (\"Sequence N has an empty "
                     "prompt\"); every later request fails with HTTP 404 \"generation thread died\"",
                     "cached_prompt_kills_generation.py", ("--model", "default_model"),
                     ("followup-differs", "request-crashed"), report=MLX_LM_CACHED)),
        why_unconfirmed=(("compute-after-disconnect",
                          "Without the harness mlx-lm stops a streaming request whose client has gone at its next "
                          "write: `gone_client_keeps_decoding.py --mode stream` with `--leave-s 0.02` or the default "
                          "exits 0 (the server idle within a quarter second, 1-2% of the full request's CPU). The "
                          "oracle's bound is a few decode steps (at least 0.25 s), which a heavily loaded machine's "
                          "scheduling can exceed, and this finding's replay rate says how steadily it showed."),
                         ("rest-drift", REST_DRIFT_UNREPLAYED)),
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
                     ("abort-ignored", "compute-after-disconnect"), gone="nonstream", report=VLLM_GONE),
               Known("busy-stream-internal-error", "a streaming request that arrives while SimpleEngine still "
                     "finishes a cancelled one is refused as busy after its 200 headers: HTTP 200, an \"Internal "
                     "server error\" frame, no text (a non-streaming one gets 503)",
                     "cancelled_stream_then_followup.py", ("--model", "tiny"), ("followup-differs",),
                     report=VLLM_BUSY_STREAM),
               Known("usage-over-max", "non-streaming chat reports more completion tokens than max_tokens "
                     "(it re-encodes the decoded text to count them)",
                     "usage_over_max_tokens.py", ("--model", "tiny", "--routes", "chat"), (), report=VLLM_USAGE)),
        why_unconfirmed=(("cancel-swallowed", SSE_SWALLOW), ("mlx-finalized-off-thread", FINALIZED_ONCE),
                         ("stalled", "Seen once, in the run's last scenario (its debug run), and never replayed: the "
                          "budget had ended. The machine was loaded (one-minute load average about 8 on 2 cores, "
                          "1.5 s per decode step, three times the unloaded pace), and the fuzzer's stack dump shows "
                          "its own client still reading r0's stream after the cancel fault. No standalone script "
                          "has shown a request that never ends after a cancelled stream (cancelled_stream_then_"
                          "followup.py's follow-ups all end), so it stays unconfirmed.")),
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
                     ("--model", "{model}", "--engine", "batched"), ("cancel-swallowed",), engine_api=True,
                     report=VLLM_SWALLOW),),
        why_unconfirmed=(("rest-drift", REST_DRIFT_UNREPLAYED), ("compute-after-disconnect", VLLM_BATCHED_POLL)),
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
        known=(Known("gone-nonstream", "keeps decoding in its model worker process for a non-streaming client "
                     "that has gone", "gone_client_keeps_decoding.py",
                     ("--model", "tiny", "--tokens", "1500", "--mode", "nonstream"),
                     ("abort-ignored", "compute-after-disconnect"), gone="nonstream", report=MOS_GONE_NONSTREAM),
               Known("gone-stream", "keeps decoding in its model worker process for a streaming client that has "
                     "gone", "gone_client_keeps_decoding.py",
                     ("--model", "tiny", "--tokens", "1500", "--mode", "stream"),
                     ("abort-ignored", "compute-after-disconnect"), gone="stream", report=MOS_GONE_STREAM),
               Known("stop-sequence-returned", "a chat answer asked to stop at a sequence the model produces inside a "
                     "longer token runs on and returns it", "stop_sequence_returned.py", ("--model", "tiny"),
                     ("stop-string-returned",), report=MOS_STOP)),
        why_unconfirmed=(("mlx-off-owner",
                          "The sentinel saw MLX entered on the model worker process's `mlx-batch-scheduler` thread "
                          "after another thread of that process had entered it first (the owner is the first thread "
                          "to enter; the scheduler thread starts lazily, at the first request, after the model is "
                          "loaded). On Linux CPU MLX no failure follows from that which a script could show without "
                          "the harness: it could only show which thread runs MLX, the fact itself."),),
        false_alarms=(("request-crashed",
                       "Its shrunk scenario is one request and a `shutdown` fault at its ADMITTED, which the fuzzer's "
                       "own HTTP client marks once it has sent the body. Against a launched server that fault is "
                       "`HttpAdapter.shutdown` (fuzz/adapters/http.py), which closes the fuzzer's own HTTP client "
                       "while the request still waits on it; the server is not stopped. The trace (seed 3661035569, "
                       "2026-11-27 19:59) has the fault at 42.9137 s and the request's ReadError 3 ms later, the "
                       "server never having answered: the connection was cut by the client, which no server can "
                       "answer on. A matter of the fuzzer, not of this server: the scenario was the seed corpus's "
                       "`shutdown_as_one_arrives` (3e22b8a), which reached launched servers although they take no "
                       "shutdown fault; since d94effe a corpus scenario runs only where the target takes its "
                       "faults."),),
    ),
    MLX_VLM,
    RAPID_MLX,
    VMLX,
    MLX_DEV_SERVER,
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
                ("lock-released-early",), report=VLLM_DOUBLE_CANCEL),)),
        ("batched", "BatchedEngine",
         (Known("stop-strands-request", "stop() leaves a request that was just handed to the engine waiting forever",
                "vllm_batched_stop_strands_request.py", ("--model", "{model}"),
                ("shutdown-left-waiter", "stray-task"), report=VLLM_STOP),
          Known("stream-swallows-cancel", STREAM_SWALLOWS_CANCEL, "vllm_stream_swallows_cancel.py",
                ("--model", "{model}", "--engine", "batched"), ("cancel-swallowed",), engine_api=True,
                report=VLLM_SWALLOW))),
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
    Blocked(
        name="locals",
        package="locals",
        version="0.2.1",
        reason="Installs (mlx 0.32, mlx-lm 0.32), but its engine is written in Metal kernels "
               "(`mx.fast.metal_kernel`) and `locals serve` refuses to start anywhere but on an Apple-silicon Mac.",
        error="locals runs on Apple-silicon Macs (MLX on Metal); this is linux on x86_64",
    ),
    Blocked(
        name="mlx-textgen",
        package="mlx-textgen",
        version="0.2.1",
        reason="Installs (with mlx-lm 0.32.2) and starts, but every completion and chat answers HTTP 500: it sizes "
               "its memory from `mx.metal.device_info()` (model_utils.py:53), which has no Metal key on CPU MLX.",
        error="[ERROR] MLX Textgen - 'max_recommended_working_set_size' (POST /v1/chat/completions: HTTP 500 "
              "{\"detail\":\"'max_recommended_working_set_size'\"})",
    ),
    Blocked(
        name="kamiwaza-mlx",
        package="kamiwaza-mlx",
        version="0.2.7",
        reason="Does not install: it requires mlx-metal, which has macOS wheels only.",
        error="Because kamiwaza-mlx>=0.2.7 depends on mlx-metal>=0.31.2,<0.32.0 [...] your requirements are "
              "unsatisfiable. (uv: wheels for mlx-metal 0.31.2 exist for macosx_14_0_arm64, macosx_15_0_arm64, "
              "macosx_26_0_arm64 only)",
    ),
    Blocked(
        name="mlx-llm-server",
        package="mlx-llm-server",
        version="0.1.10",
        reason="Does not install: it pins mlx 0.7.0 (2024), which has macOS wheels only.",
        error="Because mlx-llm-server>=0.1.10 depends on mlx==0.7.0 and mlx==0.7.0 has no wheels with a matching "
              "platform tag (e.g., `manylinux_2_36_x86_64`), we can conclude that mlx-llm-server>=0.1.10 cannot "
              "be used.",
    ),
    Blocked(
        name="mlx-serve",
        package="mlx-serve",
        version="0.3.0",
        reason="Installs (with mlx-lm 0.32.2) and serves chat: a manager that starts `mlx_lm.server` as a child "
               "process on a model's first request and proxies to it (models come from a config file, "
               "MLX_SERVE_CONFIG). It cannot be fuzzed as the zoo runs servers: the fuzzer's first, baseline "
               "request meets that cold start (6.2 s on an idle machine) and did not end (4 tries at a load "
               "average of 6 to 8; the child was stopped 7.6 to 11.4 s in), and the zoo has no warm-up step.",
        error="the baseline's follow-up request never ended, so there is nothing to compare later follow-ups with "
              "(the server's log: model.failed | model=tiny | duration=8963ms | exit_code=-15 | "
              "reason=process_crash, its child stopped with the run)",
    ),
    Blocked(
        name="mlx-router",
        package="mlx-router",
        version="2.3.1",
        reason="Installs (with mlx-lm 0.32.2, mlx-vlm and torch) and serves chat streamed and not, but refuses "
               "greedy requests: its request model wants a temperature of at least 0.01, and the fuzzer's "
               "requests ask for 0 so that answers compare; a zoo recipe cannot change the request body.",
        error="on a fresh engine with nothing else running, the follow-up request was refused 422: "
              "{\"detail\":[{\"type\":\"greater_than_equal\",\"loc\":[\"body\",\"temperature\"],"
              "\"msg\":\"Input should be greater than or equal to 0.01\",\"input\":0.0,\"ctx\":{\"ge\":0.01}}]}",
    ),
    Blocked(
        name="kooka-server",
        package="kooka-server",
        version="0.0.5",
        reason="Every release needs Python 3.12 or newer, and the zoo's venvs use the project's Python (3.11). "
               "Tried in a Python 3.12.1 venv: with the mlx-lm it pins (0.30.5) the server starts, but mlx-lm's "
               "generation thread dies at the first request (kooka's model provider has no `is_batchable`), so "
               "no completion is answered.",
        error="Because the current Python version (3.11.7) does not satisfy Python>=3.12 and kooka-server==0.0.5 "
              "depends on Python>=3.12, we can conclude that kooka-server==0.0.5 cannot be used. (on Python "
              "3.12.1: AttributeError: 'KookaModelProvider' object has no attribute 'is_batchable')",
    ),
    Blocked(
        name="plllm-mlx",
        package="plllm-mlx",
        version="1.6.3",
        reason="Every release needs Python 3.12 or newer, and the zoo's venvs use the project's Python (3.11). "
               "Tried in a Python 3.12.1 venv: it imports httpx without declaring it, and with httpx added its "
               "command refuses to run anywhere but macOS (`platform.system() != \"Darwin\"`, plllm_mlx/cli.py:700).",
        error="Because the current Python version (3.11.7) does not satisfy Python>=3.12 and plllm-mlx==1.6.3 "
              "depends on Python>=3.12, we can conclude that plllm-mlx==1.6.3 cannot be used. (on Python 3.12.1: "
              "Error: plllm-mlx only supports macOS (Apple Silicon).)",
    ),
)


ALL: tuple[Recipe, ...] = RECIPES + IN_PROCESS


def find(name: str) -> Recipe:
    for recipe in ALL:
        if recipe.name == name:
            return recipe
    raise KeyError(f"no zoo recipe named {name!r}; known: {', '.join(r.name for r in ALL)}")
