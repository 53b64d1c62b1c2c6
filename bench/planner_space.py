"""The space the planner's accuracy suite draws its configurations from, and the draw.

A configuration is a model shape, a batch, a sequence length, a remat policy, a parameter
dtype, an attention mask, operator providers and a layout, drawn with
``random.Random(seed)`` in a fixed order (:func:`draw`), so that a seed names a suite:

- shape: ``d_model`` in {1024, 1536, 2048, 2560, 3072, 4096} with 128-wide heads, ``n_kv_heads``
  in {2, 4, 8} (those that divide the heads), ``ffn_dim`` = 8/3 d x {1, 1.3, 1.75} rounded to a
  multiple of 256 (Llama's SwiGLU width and its wider variants), ``vocab_size`` in {32000,
  128256}, ``n_layers`` in 4..36; kept when the parameters are 0.2B to 8.2B;
- sequence length in {512, 1024, 2048, 4096, 8192}; tokens per step in {4096, 8192, 16384, 32768,
  65536} (the batch is tokens / sequence length, at least 1);
- ``--remat`` any registered policy; ``--param-dtype`` float32 or bfloat16 (bfloat16 compute);
  ``--attention-mask`` causal or document;
- providers: attention cudnn, pallas or native (native only up to sequence 2048: its (s, s)
  scores per layer are what the planner prices, and beyond that they are large enough that the
  run is slower than the per-configuration time limit allows); cross-entropy native or chunked;
  the other operators the registry's choice;
- layout: ``layouts`` lists the layouts a draw may use, each as ``titan train`` options; one
  H200 has ``{"dp": 1}`` with ``--microbatches`` 1 or 2 (SPMD gradient accumulation). A
  multi-GPU suite adds its layouts here (``LAYOUTS``) and draws with the same function;
- ``--layer-unroll 1`` (a rolled layer loop, which compiles in seconds whatever the depth).

A drawn configuration is kept only when its model FLOPs per step (6 N + 12 L s d per token) at
400 TFLOP/s (about half the H200's dense bf16 peak) take at most 1.2 s, so that compiling and a
few steps fit the per-configuration time limit; memory is not filtered, so some drawn
configurations do not fit and are recorded as out of memory.
"""

from __future__ import annotations

import random
from typing import Any

D_MODELS = (1024, 1536, 2048, 2560, 3072, 4096)
HEAD_DIM = 128
KV_HEADS = (2, 4, 8)
FFN_MULTIPLIERS = (1.0, 1.3, 1.75)
VOCABS = (32000, 128256)
LAYERS = (4, 36)
PARAMS = (0.2e9, 8.2e9)
SEQ_LENS = (512, 1024, 2048, 4096, 8192)
STEP_TOKENS = (4096, 8192, 16384, 32768, 65536)
REMATS = ("none", "dots", "dots-attention", "full")
PARAM_DTYPES = ("float32", "bfloat16")
MASKS = ("causal", "document")
ATTENTION = ("cudnn", "pallas", "native")
NATIVE_ATTENTION_MAX_SEQ = 2048
CROSS_ENTROPY = ("native", "chunked")
MICROBATCHES = (1, 2)
# Layouts per device count, as titan train options (one mesh; dp explicit).
LAYOUTS: dict[int, tuple[dict[str, Any], ...]] = {1: ({"dp": 1},)}
# The filter on time (module docstring).
FILTER_FLOP_S = 400e12
FILTER_STEP_S = 1.2


def _params(d: int, layers: int, kv: int, ffn: int, vocab: int) -> int:
    return layers * (2 * d * d + 2 * d * kv * HEAD_DIM + 3 * d * ffn + 2 * d) + 2 * vocab * d + d


def _shape(rng: random.Random) -> dict[str, int] | None:
    d = rng.choice(D_MODELS)
    heads = d // HEAD_DIM
    kv = rng.choice([k for k in KV_HEADS if heads % k == 0])
    ffn = round(8 * d / 3 * rng.choice(FFN_MULTIPLIERS) / 256) * 256
    vocab = rng.choice(VOCABS)
    layers = rng.randint(*LAYERS)
    if not PARAMS[0] <= _params(d, layers, kv, ffn, vocab) <= PARAMS[1]:
        return None
    return {
        "d_model": d,
        "n_layers": layers,
        "n_heads": heads,
        "n_kv_heads": kv,
        "ffn_dim": ffn,
        "vocab_size": vocab,
    }


def _step_s(shape: dict[str, int], seq_len: int, tokens: int) -> float:
    d, layers = shape["d_model"], shape["n_layers"]
    n = _params(d, layers, shape["n_kv_heads"], shape["ffn_dim"], shape["vocab_size"])
    return tokens * (6 * n + 12 * layers * seq_len * d) / FILTER_FLOP_S


def draw_one(rng: random.Random, devices: int) -> dict[str, Any] | None:
    """One configuration (``titan train`` options plus ``shape``), or None when the drawn one
    is outside the space's filters (module docstring)."""
    shape = _shape(rng)
    seq_len = rng.choice(SEQ_LENS)
    tokens = rng.choice(STEP_TOKENS)
    batch = max(tokens // seq_len, 1)
    attention = rng.choice(ATTENTION)
    config = {
        "shape": shape,
        "seq_len": seq_len,
        "batch_size": batch,
        "remat": rng.choice(REMATS),
        "param_dtype": rng.choice(PARAM_DTYPES),
        "attention_mask": rng.choice(MASKS),
        "ops": {"attention": attention, "cross_entropy": rng.choice(CROSS_ENTROPY)},
        "layer_unroll": 1,
        **rng.choice(LAYOUTS[devices]),
    }
    microbatches = rng.choice(MICROBATCHES)
    if shape is None or (attention == "native" and seq_len > NATIVE_ATTENTION_MAX_SEQ):
        return None
    if batch % microbatches == 0 and microbatches > 1:
        config["microbatches"] = microbatches
    if _step_s(shape, seq_len, batch * seq_len) > FILTER_STEP_S:
        return None
    return config


def draw(seed: int, count: int, devices: int = 1) -> list[dict[str, Any]]:
    """``count`` configurations of the space for ``devices`` GPUs, drawn with ``seed``."""
    rng = random.Random(seed)
    configs: list[dict[str, Any]] = []
    while len(configs) < count:
        config = draw_one(rng, devices)
        if config is not None:
            configs.append(config)
    return configs


def split(count: int, seed: int) -> tuple[list[int], list[int]]:
    """A random half of ``range(count)`` to fit on and the other half to score on, by
    ``seed``."""
    order = list(range(count))
    random.Random(seed).shuffle(order)
    half = sorted(order[: count // 2])
    return half, sorted(order[count // 2 :])
