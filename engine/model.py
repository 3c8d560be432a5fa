"""The model an engine serves: a local mlx-lm folder, or the embedded tiny model.

The tiny model is a small llama with seeded random weights and a byte-level BPE
tokenizer trained locally, written once as an ordinary mlx-lm folder into a
cache directory. Building it uses numpy and `tokenizers` only, never MLX, so it
may run on any thread; loading it (`load`) touches MLX and belongs to the owner
thread.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SPECIAL_TOKENS = ["<|bos|>", "<|eos|>", "<|system|>", "<|user|>", "<|assistant|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>{{ message['content'] }}<|eos|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)

# name -> llama hyper-parameters; "tiny" is the default everywhere, "0.5b" is for GPU benchmarks.
PRESETS: dict[str, dict[str, int]] = {
    "tiny": dict(hidden_size=128, num_hidden_layers=4, intermediate_size=256,
                 num_attention_heads=4, num_key_value_heads=2, vocab_size=512),
    "0.5b": dict(hidden_size=1024, num_hidden_layers=24, intermediate_size=5504,
                 num_attention_heads=16, num_key_value_heads=4, vocab_size=512),
}
CONTEXT_LENGTH = 1024
SEED = 1234
BUILDER_VERSION = 2
# The final norm's weight: every logit times 8, so the gap between the two likeliest tokens, which the
# concurrency oracle (fuzz/differential.py) needs clear before it judges a step, is 8 times wider. A power
# of two scales exactly in floating point, so every greedy choice (and every greedy output) is what it
# was at weight 1: on the fuzzer's prompts, 85 % of greedy steps had a top-1 lead under 1 nat at weight 1.
LOGIT_SCALE = 8.0

_WORDS = (
    "the a an model token stream thread lock request cancel worker owner batch decode prefill "
    "metal command buffer queue admission busy retry health ready abort finish length stop "
    "hello world apple silicon server client answer question please thank you what why how "
    "when where who is are was were be been have has do does did can could will would should "
    "one two three four five six seven eight nine ten first last next every each some any all"
).split()


@dataclass(frozen=True)
class LoadedModel:
    """What the owner thread keeps after loading; `model` holds MLX arrays and never leaves it."""

    model: Any
    tokenizer: Any
    model_id: str
    context_length: int


def cache_root() -> Path:
    return Path(os.environ.get("MLX_INVARIANTS_CACHE", Path.home() / ".cache" / "mlx-invariants"))


def tiny_model_path(preset: str = "tiny") -> Path:
    """The folder of the embedded model, built on first use (atomically, safe across processes)."""
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose one of {sorted(PRESETS)}")
    spec = json.dumps([BUILDER_VERSION, SEED, CONTEXT_LENGTH, PRESETS[preset]], sort_keys=True)
    target = cache_root() / f"{preset}-llama-{hashlib.sha256(spec.encode()).hexdigest()[:12]}"
    if (target / "config.json").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{preset}-", dir=target.parent))
    try:
        _write_tokenizer(scratch, PRESETS[preset]["vocab_size"])
        _write_weights(scratch, PRESETS[preset])
        (scratch / "config.json").write_text(json.dumps(_config(PRESETS[preset]), indent=2))
        try:
            os.rename(scratch, target)
        except OSError:
            if not (target / "config.json").exists():  # lost a race only if the winner finished
                raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return target


def _config(shape: dict[str, int]) -> dict[str, Any]:
    return {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        **shape,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "max_position_embeddings": CONTEXT_LENGTH,
        "tie_word_embeddings": True,
        "bos_token_id": SPECIAL_TOKENS.index("<|bos|>"),
        "eos_token_id": SPECIAL_TOKENS.index("<|eos|>"),
    }


def _corpus(lines: int = 4000) -> list[str]:
    rng = random.Random(SEED)
    return [" ".join(rng.choice(_WORDS) for _ in range(rng.randint(4, 16))) + "." for _ in range(lines)]


def _write_tokenizer(folder: Path, vocab_size: int) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_corpus(), trainer=trainer)
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<|bos|>",
        "eos_token": "<|eos|>",
        "model_max_length": CONTEXT_LENGTH,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
    }, indent=2))


def _write_weights(folder: Path, shape: dict[str, int]) -> None:
    import numpy as np
    from safetensors.numpy import save_file

    rng = np.random.default_rng(SEED)
    h, inter, vocab = shape["hidden_size"], shape["intermediate_size"], shape["vocab_size"]
    head_dim = h // shape["num_attention_heads"]
    kv = shape["num_key_value_heads"] * head_dim
    dtype = np.float32 if h <= 512 else np.float16

    def dense(rows: int, cols: int) -> "np.ndarray":
        return (rng.standard_normal((rows, cols), dtype=np.float32) * (1.0 / np.sqrt(cols))).astype(dtype)

    weights = {"model.embed_tokens.weight": dense(vocab, h), "model.norm.weight": np.full(h, LOGIT_SCALE, dtype)}
    for i in range(shape["num_hidden_layers"]):
        p = f"model.layers.{i}."
        weights.update({
            p + "self_attn.q_proj.weight": dense(h, h),
            p + "self_attn.k_proj.weight": dense(kv, h),
            p + "self_attn.v_proj.weight": dense(kv, h),
            p + "self_attn.o_proj.weight": dense(h, h),
            p + "mlp.gate_proj.weight": dense(inter, h),
            p + "mlp.up_proj.weight": dense(inter, h),
            p + "mlp.down_proj.weight": dense(h, inter),
            p + "input_layernorm.weight": np.ones(h, dtype),
            p + "post_attention_layernorm.weight": np.ones(h, dtype),
        })
    save_file(weights, str(folder / "model.safetensors"))


def load(source: str | None) -> LoadedModel:
    """Load `source` (a local mlx-lm folder, or None for the tiny model). Owner thread only."""
    import mlx.core as mx
    from mlx_lm import load as mlx_load

    path = Path(source) if source else tiny_model_path()
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"{path} is not an mlx-lm model folder (no config.json)")
    model, tokenizer = mlx_load(str(path))
    mx.eval(model.parameters())  # realize every lazy array here, on the owner thread
    config = json.loads((path / "config.json").read_text())
    context = int(config.get("max_position_embeddings") or getattr(tokenizer, "model_max_length", 0) or 4096)
    return LoadedModel(model, tokenizer, model_id=str(path.name if source else "mlx-invariants-tiny"),
                       context_length=context)
