"""Hugging Face Llama checkpoints <-> Titan's Llama: the config and the parameter layouts.

A Hugging Face ``LlamaForCausalLM`` (``transformers/models/llama/modeling_llama.py``) stores
each ``nn.Linear`` weight as (out features, in features) and each layer under its own name
``model.layers.<i>.*``; Titan stores matrices (in, out), splits the head axis out of the
attention projections and stacks the layers on axis 0 (:mod:`titan.models.llama`):

| Hugging Face | shape | Titan | shape |
|---|---|---|---|
| ``model.embed_tokens.weight`` | (V, E) | ``embed`` | (V, E) |
| ``...self_attn.q_proj.weight`` | (H D, E) | ``layers/wq`` | (L, E, H, D) |
| ``...self_attn.k_proj.weight``, ``v_proj`` | (K D, E) | ``layers/wk``, ``wv`` | (L, E, K, D) |
| ``...self_attn.o_proj.weight`` | (E, H D) | ``layers/wo`` | (L, H, D, E) |
| ``...mlp.gate_proj.weight``, ``up_proj`` | (F, E) | ``layers/w_gate``, ``w_up`` | (L, E, F) |
| ``...mlp.down_proj.weight`` | (E, F) | ``layers/w_down`` | (L, F, E) |
| ``...input_layernorm.weight`` | (E,) | ``layers/attn_norm`` | (L, E) |
| ``...post_attention_layernorm.weight`` | (E,) | ``layers/mlp_norm`` | (L, E) |
| ``model.norm.weight`` | (E,) | ``final_norm`` | (E,) |
| ``lm_head.weight`` | (V, E) | ``head`` | (E, V) |

Hugging Face's q/k projections are already in the rotate-half RoPE layout that Titan uses (the
conversion from Meta's interleaved layout permutes them, ``convert_llama_weights_to_hf.py``), so
no row permutation is needed. A checkpoint with ``tie_word_embeddings`` has no ``lm_head``: its
head is the embedding's transpose, and Titan trains the two apart from then on. The mapping is a
permutation of each array's elements, so import followed by export is bit-exact.

Only numpy here: no JAX, torch or transformers.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from titan.errors import TitanError
from titan.reading import json_field
from titan.shapes import ModelConfig, RopeScaling, check_shape

LAYER_PREFIX = "model.layers"
# Titan's name in ``layers`` -> the Hugging Face name inside ``model.layers.<i>``
_LAYER_NAMES = {
    "wq": "self_attn.q_proj.weight",
    "wk": "self_attn.k_proj.weight",
    "wv": "self_attn.v_proj.weight",
    "wo": "self_attn.o_proj.weight",
    "w_gate": "mlp.gate_proj.weight",
    "w_up": "mlp.up_proj.weight",
    "w_down": "mlp.down_proj.weight",
    "attn_norm": "input_layernorm.weight",
    "mlp_norm": "post_attention_layernorm.weight",
}
SUPPORTED_ROPE_TYPES = ("default", "llama3")
_HEADS = "num_attention_heads"
# Titan's shape fields by the config.json keys they come from, for errors in the file's words.
_HF_KEYS = {
    "d_model": "hidden_size",
    "n_layers": "num_hidden_layers",
    "n_heads": _HEADS,
    "n_kv_heads": "num_key_value_heads",
    "ffn_dim": "intermediate_size",
    "norm_eps": "rms_norm_eps",
}


def _refuse(field: str, value: Any, allowed: str) -> TitanError:
    return TitanError(f"config.json {field} is {value!r}; Titan's Llama supports {allowed}")


def _rope(hf: Mapping[str, Any]) -> tuple[float, RopeScaling | None]:
    """(rope_theta, scaling) of a config: ``rope_theta`` and ``rope_scaling`` (transformers 4),
    or ``rope_parameters`` holding both (transformers 5)."""
    where = "config.json"
    params = (
        json_field(hf, "rope_parameters", (dict, type(None)), where, None)
        or json_field(hf, "rope_scaling", (dict, type(None)), where, None)
        or {}
    )
    theta = json_field(hf, "rope_theta", (float, type(None)), where, None)
    theta = float(
        theta or json_field(params, "rope_theta", (float, type(None)), where, None) or 1e4
    )
    kind = params.get("rope_type", params.get("type", "default"))
    if kind not in SUPPORTED_ROPE_TYPES:
        raise _refuse("rope_scaling.rope_type", kind, "'llama3' scaling or none")
    return theta, RopeScaling.of(params) if kind == "llama3" else None


def config_from_hf(hf: Mapping[str, Any]) -> ModelConfig:
    """The Titan shape of a Hugging Face Llama ``config.json``.

    Raises:
        TitanError: not a Llama, a feature Titan's Llama lacks (biases, another activation, a
            head dim other than hidden_size / num_attention_heads, a RoPE scaling other than
            Llama 3's), or an inconsistent shape; one line naming the field.
    """
    if "model_type" not in hf:  # a Titan run's config.json, say
        raise TitanError("config.json has no model_type: not a Hugging Face model's config")
    if hf["model_type"] != "llama":
        raise _refuse("model_type", hf["model_type"], "'llama'")
    for bias in ("attention_bias", "mlp_bias"):
        if hf.get(bias):
            raise _refuse(bias, hf[bias], "false")
    if hf.get("hidden_act", "silu") != "silu":
        raise _refuse("hidden_act", hf["hidden_act"], "'silu'")
    where = "config.json"
    d_model, n_heads = json_field(hf, "hidden_size", int, where), json_field(hf, _HEADS, int, where)
    shape = dict(
        vocab_size=json_field(hf, "vocab_size", int, where),
        d_model=d_model,
        n_layers=json_field(hf, "num_hidden_layers", int, where),
        n_heads=n_heads,
        n_kv_heads=json_field(hf, "num_key_value_heads", (int, type(None)), where, None) or n_heads,
        ffn_dim=json_field(hf, "intermediate_size", int, where),
    )
    _check_in_hf_words(ModelConfig("custom", **shape))
    head_dim = json_field(hf, "head_dim", (int, type(None)), where, None) or d_model // n_heads
    if head_dim * n_heads != d_model:
        raise _refuse(
            "head_dim", head_dim, f"hidden_size / num_attention_heads = {d_model}/{n_heads}"
        )
    theta, scaling = _rope(hf)
    eps = float(json_field(hf, "rms_norm_eps", float, where, 1e-6))
    model = ModelConfig(
        "custom",
        **shape,
        rope_theta=theta,
        norm_eps=eps,
        rope_scaling=scaling,
        max_positions=_max_positions(hf),
    )
    _check_in_hf_words(model)
    return model


def _check_in_hf_words(model: ModelConfig) -> None:
    """:func:`titan.shapes.check_shape` of an imported shape, its error naming the
    ``config.json`` keys (``num_key_value_heads``), not Titan's fields (``n_kv_heads``).

    Raises:
        TitanError: the shape's error, in the file's words.
    """
    try:
        check_shape(model, "config.json")
    except TitanError as err:
        words = re.sub(r"\b(\w+)\b", lambda m: _HF_KEYS.get(m[1], m[1]), str(err))
        raise TitanError(words) from None


def _max_positions(hf: Mapping[str, Any]) -> int:
    """``max_position_embeddings``: the context the model declares (0 when absent).

    Raises:
        TitanError: it is given and not an integer >= 1.
    """
    value = json_field(hf, "max_position_embeddings", (int, type(None)), "config.json", None)
    if value is not None and value < 1:
        raise _refuse("max_position_embeddings", value, "an integer >= 1")
    return value or 0


def config_to_hf(
    model: ModelConfig, bos_id: int, eos_id: int, max_positions: int, dtype: str
) -> dict[str, Any]:
    """A Hugging Face ``config.json`` for ``model`` (untied head, ``rope_theta`` and
    ``rope_scaling`` as Llama 3.1's ``config.json`` has them; transformers 4 and 5 read it).

    Args:
        max_positions: ``max_position_embeddings`` (informative for Llama: RoPE has no table).
        dtype: the tensors' dtype name (``float32``, ``bfloat16``).
    """
    scaling = model.rope_scaling
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": model.vocab_size,
        "hidden_size": model.d_model,
        "num_hidden_layers": model.n_layers,
        "num_attention_heads": model.n_heads,
        "num_key_value_heads": model.n_kv_heads,
        "head_dim": model.head_dim,
        "intermediate_size": model.ffn_dim,
        "hidden_act": "silu",
        "rms_norm_eps": model.norm_eps,
        "rope_theta": model.rope_theta,
        "rope_scaling": None
        if scaling is None
        else {
            "rope_type": "llama3",
            "factor": scaling.factor,
            "low_freq_factor": scaling.low_freq_factor,
            "high_freq_factor": scaling.high_freq_factor,
            "original_max_position_embeddings": scaling.original_max_position_embeddings,
        },
        "max_position_embeddings": max_positions,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
        "torch_dtype": dtype,
    }


def _layouts(model: ModelConfig) -> dict[str, tuple[Callable, Callable]]:
    """Titan layer name -> (HF array -> Titan array, Titan array -> HF array)."""
    e, h, k, d = model.d_model, model.n_heads, model.n_kv_heads, model.head_dim

    def heads(n):  # (n D, E) <-> (E, n, D)
        return (lambda w: w.T.reshape(e, n, d), lambda w: w.reshape(e, n * d).T)

    same = (lambda w: w, lambda w: w)
    transposed = (lambda w: w.T, lambda w: w.T)
    return {
        "wq": heads(h),
        "wk": heads(k),
        "wv": heads(k),
        "wo": (lambda w: w.T.reshape(h, d, e), lambda w: w.reshape(h * d, e).T),
        "w_gate": transposed,
        "w_up": transposed,
        "w_down": transposed,
        "attn_norm": same,
        "mlp_norm": same,
    }


def _take(tensors: Mapping[str, np.ndarray], name: str, shape: tuple[int, ...]) -> np.ndarray:
    if name not in tensors:
        raise TitanError(f"the safetensors have no tensor {name}")
    value = tensors[name]
    if tuple(value.shape) != shape:
        raise TitanError(f"tensor {name} has shape {tuple(value.shape)}, config.json says {shape}")
    return value


# Buffers that older Hugging Face Llama checkpoints hold beside the weights (RoPE's inverse
# frequencies, derived from the config): not parameters.
_BUFFER_SUFFIXES = ("rotary_emb.inv_freq",)


def _check_no_leftovers(tensors: Mapping[str, np.ndarray], model: ModelConfig) -> None:
    """Refuse tensors that ``model`` has no place for: they would be dropped without a word.

    Raises:
        TitanError: names the first few and how many there are.
    """
    wanted = {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"}
    wanted |= {
        f"{LAYER_PREFIX}.{i}.{hf_name}"
        for i in range(model.n_layers)
        for hf_name in _LAYER_NAMES.values()
    }
    left = sorted(k for k in tensors if k not in wanted and not k.endswith(_BUFFER_SUFFIXES))
    if left:
        shown = ", ".join(left[:3]) + (", ..." if len(left) > 3 else "")
        raise TitanError(
            f"the safetensors hold {len(left)} tensors that config.json's Llama has no place "
            f"for ({shown}): a config.json of another model, or a feature Titan's Llama lacks"
        )


def params_from_hf(
    tensors: Mapping[str, np.ndarray], model: ModelConfig, tied: bool
) -> dict[str, Any]:
    """Titan's whole-model parameter tree (host arrays, the tensors' dtype) from a Hugging Face
    state dict.

    Args:
        tensors: name -> array (every shard's tensors; read lazily is fine).
        tied: ``tie_word_embeddings``: the head is the embedding's transpose (``lm_head.weight``
            is then ignored when present).

    Raises:
        TitanError: a tensor is missing or has the wrong shape, or a tensor is left over (a
            layer beyond ``num_hidden_layers``, a bias); names it.
    """
    _check_no_leftovers(tensors, model)
    v, e, f = model.vocab_size, model.d_model, model.ffn_dim
    hd, kd = model.n_heads * model.head_dim, model.n_kv_heads * model.head_dim
    hf_shapes = {
        "wq": (hd, e),
        "wk": (kd, e),
        "wv": (kd, e),
        "wo": (e, hd),
        "w_gate": (f, e),
        "w_up": (f, e),
        "w_down": (e, f),
        "attn_norm": (e,),
        "mlp_norm": (e,),
    }
    layouts = _layouts(model)
    layers = {
        name: np.stack(
            [
                layouts[name][0](_take(tensors, f"{LAYER_PREFIX}.{i}.{hf_name}", hf_shapes[name]))
                for i in range(model.n_layers)
            ]
        )
        for name, hf_name in _LAYER_NAMES.items()
    }
    embed = _take(tensors, "model.embed_tokens.weight", (v, e))
    head = embed if tied else _take(tensors, "lm_head.weight", (v, e))
    return {
        "embed": np.asarray(embed),
        "layers": layers,
        "final_norm": np.asarray(_take(tensors, "model.norm.weight", (e,))),
        "head": np.ascontiguousarray(head.T),
    }


def params_to_hf(params: Mapping[str, Any], model: ModelConfig) -> dict[str, np.ndarray]:
    """A Hugging Face state dict (contiguous host arrays, untied ``lm_head``) from Titan's
    whole-model parameter tree (:func:`params_from_hf` inverted)."""
    layouts = _layouts(model)
    tensors = {
        "model.embed_tokens.weight": params["embed"],
        "model.norm.weight": params["final_norm"],
        "lm_head.weight": params["head"].T,
    }
    for name, hf_name in _LAYER_NAMES.items():
        stacked = np.asarray(params["layers"][name])
        for i in range(model.n_layers):
            tensors[f"{LAYER_PREFIX}.{i}.{hf_name}"] = layouts[name][1](stacked[i])
    return {name: np.ascontiguousarray(value) for name, value in tensors.items()}
