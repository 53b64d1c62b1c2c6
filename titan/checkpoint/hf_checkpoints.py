"""Hugging Face Llama directories in and out of Titan: ``titan import hf`` and ``titan export hf``.

Import (:func:`import_hf`) reads a Hugging Face Llama directory (``config.json``, the
safetensors, one file or shards with ``model.safetensors.index.json``, and its tokenizer:
``tokenizer.json``, ``tokenizer.model`` or Meta's ``original/tokenizer.model``) and writes a
directory shaped like a run dir: ``config.json`` (the model shape and default options),
``tokenizer.model`` and a Titan checkpoint at step 0 (``checkpoints/0``: the whole model as one
SPMD chunk with a fresh AdamW state), which ``titan train --init-from`` starts from on any layout
and ``titan export hf`` reads back. Weights become float32 master weights (an exact widening of
bfloat16 or float16); names and layouts are mapped by :mod:`titan.models.hf_llama`.

Export (:func:`export_hf`) reads a run's checkpoint (any layout: the chunks are joined on the
host) and writes ``model.safetensors`` (or shards of at most :data:`SHARD_BYTES` with their
index), ``config.json`` and the tokenizer's files (:func:`titan.data.tokenizer.tokenizer_files`).

Both write into a temporary sibling of the output and rename it at the end, so a failure leaves
nothing behind; an existing output is refused.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import jax
import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file

from titan.checkpoint.checkpointer import Checkpointer, open_checkpoint, params_only
from titan.checkpoint.init_from import saved_model
from titan.checkpoint.resume import TOKENIZER_FILE
from titan.config import ComputeOptions, ModelOptions, OptimizerOptions, TrainConfig
from titan.config_files import config_to_data
from titan.data.tokenizer import Tokenizer, load_tokenizer, tokenizer_files
from titan.errors import TitanError
from titan.inert import inert
from titan.layouts.builders import build_adapter
from titan.layouts.contract import ChunkState, TrainState
from titan.layouts.description import LayoutDescription
from titan.models.adapters.base import ModelAdapter
from titan.models.adapters.maxtext_checkpoints import NO_LLAMA, refuse_maxtext_source
from titan.models.hf_llama import config_from_hf, config_to_hf, params_from_hf, params_to_hf
from titan.ops import Ops
from titan.optimizer import build_optimizer
from titan.out_paths import (
    check_new_dir,
    check_outside_run,
    make_dir,
    remove_orphaned_stagings,
)
from titan.parallel.chunks import Chunk, chunk_item, chunk_ranges, join_layers, whole_model
from titan.parallel.mesh import DeviceMesh, host_mesh
from titan.reading import json_field, read_json
from titan.shapes import ModelConfig
from titan.telemetry.records import CONFIG_FILE

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
SHARD_BYTES = 5 * 10**9
"""Largest safetensors shard written (bytes): transformers' ``save_pretrained`` default
``max_shard_size="5GB"``."""
TOKENIZER_CANDIDATES = ("tokenizer.json", "tokenizer.model", "original/tokenizer.model")


def _safetensors_files(source: Path) -> list[Path]:
    """The shards named by the index, else ``model.safetensors``, else every ``*.safetensors``."""
    index = source / INDEX_FILE
    if index.is_file():
        where = f"titan import hf {index}"
        weight_map = json_field(read_json(index, "titan import hf"), "weight_map", dict, where, {})
        return [
            source / name
            for name in sorted({json_field(weight_map, k, str, where) for k in weight_map})
        ]
    if (source / SINGLE_FILE).is_file():
        return [source / SINGLE_FILE]
    files = sorted(source.glob("*.safetensors"))
    if not files:
        raise TitanError(f"titan import hf: no safetensors in {source}")
    return files


def read_safetensors(source: Path) -> dict[str, np.ndarray]:
    """Every tensor of a directory's safetensors, as numpy arrays (bfloat16 as ml_dtypes').

    Raises:
        TitanError: a shard is missing or unreadable.
    """
    tensors: dict[str, np.ndarray] = {}
    for path in _safetensors_files(source):
        try:
            with safe_open(str(path), framework="numpy") as f:
                tensors.update({name: f.get_tensor(name) for name in f.keys()})  # noqa: SIM118
        except (OSError, ValueError) as err:
            raise TitanError(f"titan import hf: cannot read {path} ({err})") from None
        except Exception as err:  # noqa: BLE001 - safetensors raises its own SafetensorError
            raise TitanError(f"titan import hf: {path} is not safetensors ({err})") from None
    return tensors


def find_tokenizer(source: Path) -> Tokenizer:
    """The tokenizer of a Hugging Face directory: the first of :data:`TOKENIZER_CANDIDATES`,
    with the end tokens its ``generation_config.json`` and ``config.json`` name.

    Raises:
        TitanError: none is there, or it does not load.
    """
    for name in TOKENIZER_CANDIDATES:
        if (source / name).is_file():
            return load_tokenizer(source / name, config_dirs=(source,))
    raise TitanError(
        f"titan import hf: no tokenizer in {source} ({', '.join(TOKENIZER_CANDIDATES)})"
    )


def host_abstract(
    adapter: ModelAdapter, tx: Any
) -> Callable[[list[Chunk], DeviceMesh], dict[str, ChunkState]]:
    """(chunks, mesh) -> their checkpoint items as ``jax.ShapeDtypeStruct`` trees (parameters
    and optimizer state of ``tx``), as the layouts' ``abstract_items`` give them."""

    def abstract(chunks: list[Chunk], mesh: DeviceMesh) -> dict[str, ChunkState]:
        return {
            chunk_item(c.index): mesh.state_shardings(tx, *adapter.abstract_params(c))[1]
            for c in chunks
        }

    return abstract


@contextmanager
def _staged(out: Path, flag: str) -> Iterator[Path]:
    """A new temporary sibling of ``out`` (parents made), ``.<name>.tmp<pid>``, renamed to
    ``out`` when the block succeeds and removed when it fails. A failure (a stop signal among
    them) first waits for the threads the block started (orbax writes from its own threads,
    which an exception in the main thread does not stop), so that none writes into the removed
    folder. The stagings of ``out`` left by processes that are gone (killed) are removed first.

    Raises:
        TitanError: ``out`` exists or cannot be created (names ``flag`` and ``out``).
    """
    given, out = out, check_new_dir(out, flag)
    remove_orphaned_stagings(out.parent, _staging_prefix(out))
    staging = out.with_name(f"{_staging_prefix(out)}{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    threads = set(threading.enumerate())
    try:
        make_dir(staging, given, flag)
        yield staging
        os.replace(staging, out)
    except BaseException:
        for thread in set(threading.enumerate()) - threads:
            if not thread.daemon:
                thread.join()
        raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _staging_prefix(out: Path) -> str:
    return f".{out.name}.tmp"


def _whole_tree(joined: dict[str, Any], shapes: Any) -> Any:
    """The nested parameter tree of ``shapes`` filled from :func:`join_layers`'s flat dict."""
    return jax.tree_util.tree_map_with_path(
        lambda path, _: joined[jax.tree_util.keystr(path)], shapes
    )


def _build(
    model: ModelConfig,
    source: ModelOptions,
    compute: ComputeOptions,
    optimizer: OptimizerOptions,
    seq_len: int,
) -> tuple[ModelAdapter, Any]:
    """The adapter of ``model`` (on the CPU) and the optimizer of a run of these options."""
    ops = Ops("cpu", from_env=False)
    return build_adapter(model, source, compute, seq_len, ops), build_optimizer(optimizer)[0]


def import_hf(source: Path, out: Path) -> ModelConfig:
    """Write ``out``: the Titan checkpoint at step 0 of the Hugging Face Llama in ``source``.

    Returns:
        The model shape (written to ``out/config.json`` as ``model``).

    Raises:
        TitanError: ``source`` is not a supported Llama directory (one line naming the file or
            field), its tokenizer has more tokens than the embedding, or ``out`` exists or
            cannot be made.
    """
    check_new_dir(out)  # before the read: a bad --out fails at once
    hf = read_json(source / "config.json", "titan import hf")
    model = config_from_hf(hf)
    tokenizer = find_tokenizer(source)
    if tokenizer.vocab_size > model.vocab_size:
        raise TitanError(
            f"titan import hf: the tokenizer has {tokenizer.vocab_size} tokens, config.json "
            f"vocab_size is {model.vocab_size}"
        )
    tied = json_field(hf, "tie_word_embeddings", bool, "config.json", False)
    params = params_from_hf(read_safetensors(source), model, tied)
    write_llama_checkpoint(
        out, model, params, tokenizer, {"hf_import": {"source": str(source.absolute())}}
    )
    return model


def write_llama_checkpoint(
    out: Path,
    model: ModelConfig,
    params: Any,
    tokenizer: Tokenizer,
    record: dict[str, Any],
    what: str = "titan import hf",
) -> None:
    """Write ``out``, a dir shaped like a run dir: ``config.json`` (the default options of
    ``model``, with ``--seq-len`` the context the model declares where it does, the shape, and
    ``record``: where the weights came from), ``tokenizer.model`` and
    the checkpoint at step 0 of Titan's Llama ``params`` (a nested dict of host arrays, cast to
    the master weights' dtype) as one SPMD chunk with a fresh AdamW state. ``titan train
    --init-from``, ``titan export hf`` and ``titan generate`` read it. Written into a temporary
    sibling and renamed at the end: a failure leaves nothing behind.

    Raises:
        TitanError: ``out`` exists or cannot be made, or the checkpoint is not written (names
            ``what``, the command).
    """
    # The context it declares, which titan generate may fill (a run's is its --seq-len).
    context = {"seq_len": model.max_positions} if model.max_positions else {}
    cfg = TrainConfig.of(preset=model, **context)
    adapter, tx = _build(model, cfg.model, cfg.compute, cfg.optimizer, cfg.data.seq_len)
    mesh, chunk = host_mesh(), whole_model(model.n_layers)
    target = host_abstract(adapter, tx)([chunk], mesh)[chunk_item(0)]["params"]
    check_params(params, target, what)
    placed = jax.tree.map(
        lambda value, leaf: jax.device_put(np.asarray(value, leaf.dtype), leaf.sharding),
        params,
        target,
    )
    state = TrainState(0, ({"params": placed, "opt_state": tx.init(placed)},))
    layout = LayoutDescription("spmd", mesh.mesh_shape, mesh.device_count, chunk_ranges([chunk]))
    with _staged(out, "--out") as staging:
        _write_config(staging, config_to_data(cfg), model, record)
        (staging / TOKENIZER_FILE).write_bytes(tokenizer.model_proto)
        checkpointer = Checkpointer(staging, asynchronous=False)
        try:
            results = checkpointer.save(
                state, {"layout": layout.to_json(), "data_position": 0, "num_sequences": 0}
            )
        finally:
            checkpointer.close()
        if results[-1].error:
            raise TitanError(f"{what}: the checkpoint was not written ({results[-1].error})")


def check_params(params: Any, target: Any, what: str) -> None:
    """Refuse weights that Titan's Llama of this shape cannot hold, before anything is written:
    each of ``params`` (host arrays) must have its ``target`` leaf's shape, a floating-point
    dtype, and finite values (a NaN would train NaN, or fail the run's first save).

    Raises:
        TitanError: names ``what`` (the command), the parameter, and what is wrong with it.
    """

    def named(tree: Any) -> dict[str, Any]:
        leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
        return {jax.tree_util.keystr(path, simple=True, separator="."): x for path, x in leaves}

    given = named(params)
    for name, leaf in named(target).items():
        if name not in given:
            raise TitanError(f"{what}: no parameter {name}")
        value = np.asarray(given[name])
        if value.shape != leaf.shape:
            raise TitanError(
                f"{what}: parameter {name} has shape {value.shape}, the model's other weights "
                f"make it {leaf.shape}"
            )
        if not np.issubdtype(value.dtype, np.floating) and value.dtype.name != "bfloat16":
            raise TitanError(f"{what}: parameter {name} is {value.dtype}, not floating point")
        if not np.isfinite(value.astype(np.float32)).all():
            raise TitanError(f"{what}: parameter {name} holds NaN or infinite values")


def _write_config(directory: Path, train: dict, model: ModelConfig, record: dict) -> None:
    """``config.json``: the options ``train`` (:func:`titan.config_files.config_to_data`), the
    model and ``record``."""
    payload = {"train": train, "model": dataclasses.asdict(model), **record}
    (directory / CONFIG_FILE).write_text(json.dumps(payload, indent=1))


def export_hf(
    run_dir: Path, step: int | None, out: Path | None, dtype: str = "float32"
) -> tuple[int, Path]:
    """Write ``out`` (default ``./<run id>-hf-<step>``): a Hugging Face Llama directory of
    ``run_dir``'s checkpoint ``step`` (the newest when None), tensors in ``dtype``. Returns
    (the step exported, the directory written).

    Raises:
        TitanError: not a run dir, a diffusion run, no such committed checkpoint (none that
            can be read, without ``step``), or ``out`` exists, cannot be made or lies among the
            run's checkpoints.
    """
    cfg, model = saved_model(run_dir, "titan export hf")
    if model.family != "llama":
        raise TitanError(f"titan export hf: {run_dir} {NO_LLAMA}")
    refuse_maxtext_source(cfg.model.model_source, run_dir, "titan export hf")
    if not (run_dir / TOKENIZER_FILE).is_file():
        raise TitanError(f"titan export hf: {run_dir}: no {TOKENIZER_FILE} there (no tokenizer)")
    tokenizer = load_tokenizer(run_dir / TOKENIZER_FILE)
    checkpointer, listed = open_checkpoint(run_dir, step, "titan export hf")
    try:
        _check_export_dir(out or _export_dir(run_dir, listed), run_dir)  # before the long read
        adapter, tx = _build(model, cfg.model, cfg.compute, cfg.optimizer, cfg.data.seq_len)
        abstract = params_only(host_abstract(adapter, tx))
        if step is None:  # the newest readable: a live run may delete `listed` meanwhile
            (items, chunks, _), step, skipped = checkpointer.read_newest(
                lambda s: checkpointer.restore_host(s, abstract, partial=True)
            )
            for unreadable in skipped:
                line = f"titan export hf: {unreadable.error}; using checkpoint {step}"
                print(inert(line), file=sys.stderr, flush=True)
        else:
            items, chunks, _ = checkpointer.restore_host(step, abstract, partial=True)
    finally:
        checkpointer.close()
    if out is None:  # the step read may not be the one listed: its default folder checked too
        out = _export_dir(run_dir, step)
        _check_export_dir(out, run_dir)
    params = [items[chunk_item(c.index)]["params"] for c in chunks]
    joined = join_layers(params, adapter.is_layer_stacked, adapter.layer_axis)
    shapes, _ = adapter.abstract_params(whole_model(model.n_layers))
    whole = jax.tree.map(np.asarray, _whole_tree(joined, shapes))
    tensors = {
        name: value.astype(jax.numpy.dtype(dtype))
        for name, value in params_to_hf(whole, model).items()
    }
    max_positions = model.max_positions or rope_positions(model)
    hf = config_to_hf(model, tokenizer.bos_id, tokenizer.eos_id, max_positions, dtype)
    with _staged(out, "--out") as staging:
        _write_safetensors(staging, tensors)
        (staging / "config.json").write_text(json.dumps(hf, indent=2))
        for name, data in tokenizer_files(tokenizer).items():
            (staging / name).parent.mkdir(parents=True, exist_ok=True)
            (staging / name).write_bytes(data)
    return step, out


def _readable_as_umask(path: Path) -> None:
    """Give ``path`` the mode a new file gets under the process's umask (safetensors writes
    through a private temporary file, mode 0600, which others sharing the export could not
    read)."""
    umask = os.umask(0)
    os.umask(umask)
    path.chmod(0o666 & ~umask)


def _check_export_dir(out: Path, run_dir: Path) -> None:
    """Refuse an ``--out`` that exists, cannot be made, or lies in ``run_dir``'s checkpoints
    (a folder there would be taken for a checkpoint, and deleted with the run's old ones).

    Raises:
        TitanError: one line naming ``--out``.
    """
    check_new_dir(out)
    check_outside_run(out, run_dir)


def _export_dir(run_dir: Path, step: int) -> Path:
    """``titan export hf``'s default ``--out``: ``./<run id>-hf-<step>``."""
    return Path(f"{run_dir.absolute().name}-hf-{step}")


def rope_positions(model: ModelConfig) -> int:
    """``max_position_embeddings`` of a model that declared none (trained from scratch): the
    positions its RoPE tells apart. Unscaled, the longest wavelength of its frequencies
    theta^(-2i/D), i < D/2 (Su et al. 2021): 2 pi theta^((D-2)/D) positions, after
    which the slowest rotation repeats; with Llama 3's scaling, factor x
    original_max_position_embeddings (Meta 2024, the context Llama 3.1 declares)."""
    if model.rope_scaling is not None:
        scaling = model.rope_scaling
        return int(scaling.factor * scaling.original_max_position_embeddings)
    d = model.head_dim
    return int(2 * math.pi * model.rope_theta ** ((d - 2) / d))


def shard_names(tensors: dict[str, np.ndarray], max_bytes: int = SHARD_BYTES) -> list[list[str]]:
    """Tensor names grouped into shards of at most ``max_bytes`` (a larger tensor alone), in
    order."""
    shards: list[list[str]] = [[]]
    size = 0
    for name, value in tensors.items():
        if shards[-1] and size + value.nbytes > max_bytes:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += value.nbytes
    return shards


def _write_safetensors(directory: Path, tensors: dict[str, np.ndarray]) -> None:
    """``model.safetensors``, or ``model-0000i-of-0000n.safetensors`` and their index."""
    shards = shard_names(tensors)
    metadata = {"format": "pt"}  # what transformers' loader expects of a PyTorch checkpoint
    if len(shards) == 1:
        save_file(tensors, str(directory / SINGLE_FILE), metadata=metadata)
        _readable_as_umask(directory / SINGLE_FILE)
        return
    weight_map = {}
    for i, names in enumerate(shards, 1):
        file = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        save_file({n: tensors[n] for n in names}, str(directory / file), metadata=metadata)
        _readable_as_umask(directory / file)
        weight_map.update(dict.fromkeys(names, file))
    total = sum(value.nbytes for value in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (directory / INDEX_FILE).write_text(json.dumps(index, indent=2))
