"""A FastAPI chat server over mlx-lm, for loop_blocked_by_request.py's own tests: its route generates
on the event loop (a synchronous `mlx_lm.generate` inside `async def`, the bug INV108 reports) unless
`--offload` sends the generation to a worker thread (`asyncio.to_thread`) as a correct server does.

    python tests/zoo/loop_server.py MODEL_DIR PORT [--offload]
"""

from __future__ import annotations

import asyncio
import sys

import mlx_lm
import uvicorn
from fastapi import FastAPI

MODEL_DIR, PORT = sys.argv[1], int(sys.argv[2])
OFFLOAD = "--offload" in sys.argv
app = FastAPI()
model, tokenizer = mlx_lm.load(MODEL_DIR)
tokenizer.eos_token_ids = ()  # the tiny model's answers run to max_tokens, as the reproducer needs


def _generate(prompt: str, max_tokens: int) -> str:
    return mlx_lm.generate(model, tokenizer, prompt, max_tokens=max_tokens)


@app.get("/v1/models")
async def models() -> dict:
    return {"object": "list", "data": [{"id": "tiny", "object": "model"}]}


@app.post("/v1/chat/completions")
async def chat(body: dict) -> dict:
    prompt, max_tokens = body["messages"][-1]["content"], int(body.get("max_tokens", 16))
    if OFFLOAD:
        text = await asyncio.to_thread(_generate, prompt, max_tokens)
    else:
        text = _generate(prompt, max_tokens)
    produced = len(tokenizer.encode(text))
    return {"object": "chat.completion", "usage": {"completion_tokens": produced},
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}}]}


if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=PORT, log_level="warning")
