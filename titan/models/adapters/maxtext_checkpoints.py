"""MaxText parameter checkpoints and Titan's Llama: a converter both ways, MaxText's checkpoint
files, and ``titan export maxtext`` (``titan import maxtext`` writes its output as ``titan import
hf`` does: :mod:`titan.checkpoint.maxtext_import`). Needs no maxtext (numpy and orbax only),
so it runs on Python 3.11 too.

MaxText's Llama-family decoder (the ``llama2`` block: llama2, llama3, and mistral without its
sliding window) and Titan's Llama compute the same function with three differences
(checked against MaxText's own per-token loss, ``tests/integration/test_maxtext_checkpoints.py``):

- names: :data:`LAYER_NAMES` and :data:`TOP_NAMES`;
- the layer axis of stacked parameters: 1 in MaxText's scanned decoder (``param_scan_axis``),
  0 in Titan's;
- the query kernel: MaxText folds attention's 1/sqrt(head_dim) into the query projection's
  initialisation and does not scale inside attention (``query_pre_attn_scalar`` unset), so
  Titan's ``wq`` is MaxText's query kernel times sqrt(head_dim). When sqrt(head_dim) is a power of
  two (head_dim 4, 16, 64, 256) the scaling is exact and a round trip is bit-exact; otherwise it
  is exact to float32 rounding.

A MaxText params checkpoint is orbax's, as ``maxtext.common.checkpointing.save_params_to_path``
writes it: a checkpointable ``items`` holding ``params/params/<MaxText names>``.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from orbax.checkpoint import v1 as ocp_v1

from titan.errors import TitanError, error_line
from titan.out_paths import check_new_dir, check_outside_run
from titan.parallel.chunks import chunk_item, chunks_from_ranges, join_layers
from titan.reading import json_field, read_json
from titan.shapes import ModelConfig

# Titan's Llama layer parameter -> its path under MaxText's decoder/layers.
LAYER_NAMES = {
    "attn_norm": ("pre_self_attention_layer_norm", "scale"),
    "mlp_norm": ("post_self_attention_layer_norm", "scale"),
    "wq": ("self_attention", "query", "kernel"),
    "wk": ("self_attention", "key", "kernel"),
    "wv": ("self_attention", "value", "kernel"),
    "wo": ("self_attention", "out", "kernel"),
    "w_gate": ("mlp", "wi_0", "kernel"),
    "w_up": ("mlp", "wi_1", "kernel"),
    "w_down": ("mlp", "wo", "kernel"),
}
# Titan's Llama parameters outside the layers -> their MaxText paths.
TOP_NAMES = {
    "embed": ("token_embedder", "embedding"),
    "final_norm": ("decoder", "decoder_norm", "scale"),
    "head": ("decoder", "logits_dense", "kernel"),
}
MAXTEXT_LAYER_AXIS, TITAN_LAYER_AXIS = 1, 0
# MaxText's llama2 block defaults (maxtext/configs/models/llama2-7b.yml, base.yml)
DEFAULT_ROPE_THETA, DEFAULT_NORM_EPS = 10_000.0, 1e-5
# What the exports say of a run whose model is not a Llama (config.json's model.family).
NO_LLAMA = "is a diffusion (DiT) run, which has no Llama to export"
# The RoPE scaling of MaxText's rope_type "llama3.1" (fixed there: maxtext/layers/embeddings.py,
# LLaMARotaryEmbedding._apply_scaling_factor), in Titan's RopeScaling fields.
MAXTEXT_LLAMA31_SCALING = {
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}
_MISSING_METADATA = "Metadata file does not exist"  # orbax's warning, dropped on absl's logger


def refuse_maxtext_source(model_source: str, run_dir: Path, what: str) -> None:
    """Refuse a MaxText-source run where Titan's Llama parameters are needed (``what``: the
    command), pointing to the conversion.

    Raises:
        TitanError: ``model_source`` is ``maxtext``.
    """
    if model_source == "maxtext":
        raise TitanError(
            f"{what}: {run_dir} holds MaxText parameters (--model-source maxtext): convert a "
            "llama-family run with titan export maxtext, then titan import maxtext (a Titan "
            "Llama checkpoint)"
        )


def rope_settings(scaling: dict | None, source: str) -> dict[str, Any]:
    """MaxText's settings for a Titan Llama's RoPE scaling (``config.json``'s
    ``model.rope_scaling``): none for plain RoPE, ``rope_type=llama3.1`` for Llama 3.1's
    (:data:`MAXTEXT_LLAMA31_SCALING`, the only scaling MaxText's llama2 block takes).

    Raises:
        TitanError: another scaling (names ``source`` and its factors).
    """
    if scaling is None:
        return {}
    if {k: scaling.get(k) for k in MAXTEXT_LLAMA31_SCALING} == MAXTEXT_LLAMA31_SCALING:
        return {"rope_type": "llama3.1"}
    fields = ", ".join(f"{k} {scaling.get(k)}" for k in MAXTEXT_LLAMA31_SCALING)
    raise TitanError(
        f"{source}: RoPE scaling ({fields}) is not MaxText's llama3.1 scaling (factor 8, "
        "low_freq_factor 1, high_freq_factor 4, original_max_position_embeddings 8192)"
    )


def _get(tree: dict, path: tuple[str, ...], source: str) -> np.ndarray:
    for key in path:
        if not isinstance(tree, dict) or key not in tree:
            raise TitanError(f"{source}: no parameter {'/'.join(path)} (not a llama2-block model)")
        tree = tree[key]
    return np.asarray(tree)


def _put(tree: dict, path: tuple[str, ...], value: np.ndarray) -> None:
    for key in path[:-1]:
        tree = tree.setdefault(key, {})
    tree[path[-1]] = value


def _query_scale(wq: np.ndarray) -> np.float32:
    """sqrt(head_dim) of a query kernel (..., heads, head_dim), in float32."""
    return np.float32(math.sqrt(wq.shape[-1]))


def maxtext_to_llama(weights: dict, source: str = "checkpoint") -> dict[str, Any]:
    """Titan's Llama parameters (nested dict of numpy arrays, layers stacked on axis 0) from
    MaxText's llama2-block parameters (``token_embedder``, ``decoder``).

    Raises:
        TitanError: a parameter is missing (names it and ``source``).
    """
    layers = {}
    for name, path in LAYER_NAMES.items():
        value = np.moveaxis(_get(weights, ("decoder", "layers", *path), source), 1, 0)
        layers[name] = value * _query_scale(value) if name == "wq" else value
    params = {name: _get(weights, path, source) for name, path in TOP_NAMES.items()}
    return {**params, "layers": layers}


def llama_to_maxtext(params: dict) -> dict[str, Any]:
    """MaxText's llama2-block parameters from Titan's Llama parameters (the inverse of
    :func:`maxtext_to_llama`)."""
    weights: dict[str, Any] = {}
    for name, path in TOP_NAMES.items():
        _put(weights, path, np.asarray(params[name]))
    for name, path in LAYER_NAMES.items():
        value = np.asarray(params["layers"][name])
        if name == "wq":
            value = value / _query_scale(value)
        _put(weights, ("decoder", "layers", *path), np.moveaxis(value, 0, 1))
    return weights


def llama_shape(
    params: dict, rope_theta: float, norm_eps: float, name: str = "custom"
) -> ModelConfig:
    """The shape of Titan's Llama parameters.

    Raises:
        TitanError: head_dim is not d_model / n_heads (Titan's Llama derives it).
    """
    vocab, d_model = np.shape(params["embed"])
    n_layers, _, n_heads, head_dim = np.shape(params["layers"]["wq"])
    if n_heads * head_dim != d_model:
        raise TitanError(
            f"head_dim {head_dim} x {n_heads} heads != d_model {d_model}: Titan's Llama takes "
            "head_dim = d_model / n_heads"
        )
    n_kv = np.shape(params["layers"]["wk"])[2]
    ffn = np.shape(params["layers"]["w_gate"])[2]
    return ModelConfig(name, vocab, d_model, n_layers, n_heads, n_kv, ffn, rope_theta, norm_eps)


def _drop_missing_metadata(record: logging.LogRecord) -> bool:
    """absl log filter: orbax warns that ``_CHECKPOINT_METADATA`` is missing when it reads an
    item without it (MaxText's and these commands' items); reading works, and an error after it
    is to be one line."""
    return not record.getMessage().startswith(_MISSING_METADATA)


def _as_numpy(path: Path) -> Any:
    """An orbax pytree item read to host numpy arrays (no devices or shardings needed)."""
    absl = logging.getLogger("absl")
    if _drop_missing_metadata not in absl.filters:
        absl.addFilter(_drop_missing_metadata)
    checkpointer = ocp.PyTreeCheckpointer()
    tree = checkpointer.metadata(path)
    tree = getattr(getattr(tree, "item_metadata", None), "tree", tree)
    args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), tree)
    return checkpointer.restore(path, args=ocp.args.PyTreeRestore(restore_args=args))


def read_maxtext_params(path: Path) -> dict[str, Any]:
    """MaxText's parameters (``items/params/params``) of a params checkpoint, as numpy.

    Raises:
        TitanError: ``path`` holds no such checkpoint, or its files cannot be read (truncated,
            garbled: orbax's and tensorstore's errors in one line).
    """
    items = Path(path).absolute() / "items"
    if not items.is_dir():
        raise TitanError(f"{path}: not a MaxText params checkpoint (no items/)")
    try:
        tree = _as_numpy(items)
    except Exception as err:  # noqa: BLE001 - tensorstore's DATA_LOSS, orbax's metadata errors
        raise TitanError(f"{path}: the checkpoint cannot be read ({error_line(err)})") from None
    try:
        return tree["params"]["params"]
    except (KeyError, TypeError):
        raise TitanError(f"{path}: no items/params/params in the checkpoint") from None


def write_maxtext_params(path: Path, weights: dict) -> None:
    """Write MaxText's parameters as MaxText's ``save_params_to_path`` does (``items``,
    ``params/params/...``). Raises TitanError if ``path`` exists."""
    path = check_new_dir(path)
    ocp_v1.save(path, {"params": {"params": weights}}, checkpointable_name="items")


def read_run_params(run_dir: Path, step: int | None = None) -> tuple[dict, dict, int]:
    """A Titan run's whole-model parameters at ``step`` (default: the newest checkpoint),
    joined from its chunks to host numpy arrays, with its ``config.json`` and the step.

    Raises:
        TitanError: no config.json, a diffusion run, no checkpoint, or not the step asked for.
    """
    run_dir = Path(run_dir).absolute()
    config_path = run_dir / "config.json"
    if not config_path.is_file():
        raise TitanError(f"{run_dir}: not a Titan run dir (no config.json)")
    where = f"RUN_DIR {config_path}"
    config = read_json(config_path, "RUN_DIR")
    model = json_field(config, "model", dict, where)
    if json_field(model, "family", str, f"{where} model", "llama") != "llama":
        raise TitanError(f"{run_dir} {NO_LLAMA}")
    root = run_dir / "checkpoints"
    steps = sorted(int(p.name) for p in root.glob("*") if (p / "meta" / "metadata").is_file())
    if not steps or (step is not None and step not in steps):
        wanted = "no checkpoint" if step is None else f"no checkpoint at step {step}"
        raise TitanError(f"{run_dir}: {wanted} in {root}")
    step = steps[-1] if step is None else step
    meta_path = root / str(step) / "meta" / "metadata"
    layout = json_field(read_json(meta_path, "RUN_DIR"), "layout", dict, f"RUN_DIR {meta_path}")
    chunks = chunks_from_ranges(json_field(layout, "chunks", list, f"RUN_DIR {meta_path} layout"))
    trees = [_as_numpy(root / str(step) / chunk_item(c.index))["params"] for c in chunks]
    train = json_field(config, "train", dict, where)
    maxtext = json_field(train, "model", dict, where, {}).get("model_source") == "maxtext"
    axis = MAXTEXT_LAYER_AXIS if maxtext else TITAN_LAYER_AXIS
    joined = join_layers(trees, _stacks_layers(maxtext), axis)
    return _unflatten(joined), config, step


def _stacks_layers(maxtext: bool):
    def stacked(path: tuple) -> bool:
        keys = [getattr(k, "key", None) for k in path]
        return keys[:2] == ["decoder", "layers"] if maxtext else "layers" in keys

    return stacked


def _unflatten(joined: dict[str, Any]) -> dict[str, Any]:
    """``join_layers``' ``keystr`` names (``['layers']['wq']``) back to a nested dict."""
    tree: dict[str, Any] = {}
    for name, value in joined.items():
        _put(tree, tuple(part.strip("'") for part in name[1:-1].split("][")), np.asarray(value))
    return tree


def export_run(run_dir: Path, out: Path, step: int | None = None) -> dict[str, Any]:
    """Write a Titan run's parameters as a MaxText params checkpoint at ``out``: Titan's Llama
    converted (:func:`llama_to_maxtext`), a MaxText-source run's as they are. Returns the
    MaxText settings that build the model (``base_emb_dim=...``) and the step.

    Raises:
        TitanError: not a run dir, a diffusion run, no checkpoint, a RoPE scaling MaxText does
            not take (:func:`rope_settings`), ``out`` exists, cannot be made, or lies in the
            run's checkpoints folder (:func:`titan.out_paths.check_outside_run`).
    """
    check_new_dir(out)  # before the read: a bad --out fails at once
    check_outside_run(out, run_dir)
    params, config, step = read_run_params(run_dir, step)
    model = config["train"].get("model", {})
    if model.get("model_source") == "maxtext":
        weights = params
        settings = {
            "model_name": model["maxtext_model"],
            "vocab_size": config["model"]["vocab_size"],
            **model.get("maxtext_set", {}),
        }
    else:
        weights = llama_to_maxtext(params)
        shape = config["model"]
        settings = {
            "model_name": "llama2-7b",
            "base_emb_dim": shape["d_model"],
            "base_num_query_heads": shape["n_heads"],
            "base_num_kv_heads": shape["n_kv_heads"],
            "base_mlp_dim": shape["ffn_dim"],
            "base_num_decoder_layers": shape["n_layers"],
            "head_dim": shape["d_model"] // shape["n_heads"],
            "vocab_size": shape["vocab_size"],
            "rope_max_timescale": shape["rope_theta"],
            "normalization_layer_epsilon": shape["norm_eps"],
            **rope_settings(shape.get("rope_scaling"), str(run_dir)),
        }
    write_maxtext_params(out, weights)
    return {"step": step, "settings": settings}
