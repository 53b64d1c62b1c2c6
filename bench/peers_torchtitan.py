"""Peer: torchtitan's own llama3 model and trainer on one GPU (``bench/peers_torchtitan.py``).

What runs: torchtitan's training entry point, ``torchtitan.train.main`` (its ``ConfigManager``
and tyro command line, its ``Trainer`` and ``Trainer.train``), in a child process of this one,
on a config that this file registers through torchtitan's own extension points. Two releases:

- **0.3.0** (``--torchtitan-version 0.3.0``, the default): ``--module __main__ --config
  titan_peer_config``, a config function of this file (its ``config_registry`` mechanism).
  Model: ``Llama3Model`` built by torchtitan's helpers (``_build_llama3_layers``) as a flavor
  ``titan_peer`` of ``torchtitan.models.llama3.llama3_configs``, taken through its
  ``model_registry``: ``--model``'s shape, fused QKV, RoPE theta 500000 without frequency
  scaling (Titan's ``rope_scaling None``), FlexAttention (its llama3 default; a block-causal
  mask from per-document positions, one document per row here, so causal; ``--attention sdpa``:
  its causal ``ScaledDotProductAttention`` module). Embedding and head tied where torchtitan
  ties them for this shape (``--tie-embeddings auto``: its flavor of the same shape, ``1B`` and
  ``3B`` tie, ``8B`` and larger do not; a shape of no flavor: untied, as Titan's are). Loss:
  ``CrossEntropyLoss`` (its ``llama3_debugmodel_ce_loss``; ``--loss chunked``: the llama3
  configs' ``ChunkedLossWrapper``, which fails in the first backward: see below). Precision:
  ``--param-dtype float32``: ``training.dtype float32``, mixed precision param bfloat16, reduce
  float32, by FSDP2's ``MixedPrecisionPolicy``: its ``parallelize_llama`` always calls
  ``fully_shard``, here on a 1-rank mesh (dp_shard 1: no collective, the bf16 cast of the
  parameters for forward and backward, float32 gradients); ``bfloat16``: ``training.dtype
  bfloat16`` (parameters, gradients and AdamW state in bf16, RoPE and logits float32). Remat:
  ``none`` -> no AC; ``full`` -> ``FullAC``; ``dots`` and ``dots-attention`` -> ``SelectiveAC``
  (per-op SAC; per block it saves the outputs of the partitioner's compute-intensive ops
  (matmuls, SDPA flash/efficient), of the SDPA cuDNN/math kernels, FlexAttention, ``aten.max``
  and ``aten.linear``, except every second matmul in forward order (with fused QKV: QKV, w1 and
  w2 saved, wo and w3 recomputed); norms, RoPE, SiLU and products recomputed; Titan's ``dots``
  would recompute attention, so ``dots-attention`` is the close match). Its own defaults
  otherwise: the ``spmd_types`` SPMD backend, CUDA graphs around forward-backward
  (``--no-cuda-graphs``), AdamW ``fused``, FlexAttention compiled with its inductor options
  (``max_autotune``, coordinate-descent tuning: a longer first step).
- **0.2.2** (``--torchtitan-version 0.2.2``): a ``TrainSpec`` registered with
  ``register_train_spec`` (llama3's, with this file's dataloader, tokenizer and metrics
  builders) and a flavor ``titan_peer`` of ``llama3_args``, set by torchtitan's command line
  (``--model.name titan_peer ...``). Model: its llama3 ``Transformer`` (untied; RoPE theta
  500000 with Llama 3.1 frequency scaling, which it always applies; SwiGLU width set through
  ``multiple_of``/``ffn_dim_multiplier`` to exactly ``ffn_dim``), SDPA causal attention (its
  llama3 default; ``--attention flex``: FlexAttention with a causal mask). Loss: its
  cross-entropy. Precision: one GPU means no FSDP in 0.2.2, so ``--param-dtype float32`` is
  ``torch.autocast(bfloat16)`` over float32 parameters (its ``maybe_enable_amp``);
  ``bfloat16``: ``training.dtype bfloat16``. Remat: ``none``, ``full``, and ``selective`` with
  ``selective_ac_option op`` for ``dots``/``dots-attention`` (its ``_op_sac_save_list``: mm,
  the SDPA kernels, FlexAttention, max; every second mm recomputed). AdamW weight decay on all
  parameters (its optimizer builder has one group).

Both: ``torch.compile`` on (components ``model``, per transformer block, and ``loss``); AdamW
betas (0.9, 0.95), eps 1e-8, weight decay 0.1 (0.3.0: not on RMSNorm scales, two regex parameter
groups, as Titan's mask), learning rate ``--lr`` (Titan's default 3e-3) warmed up linearly over
30 steps (cut to ``--steps`` by torchtitan, as Titan's schedule does), cosine decay to 0.1 x lr,
global-norm clip 1.0 (Titan's defaults, ``titan/config.py``); synthetic data from a dataloader
registered through torchtitan's ``BaseDataLoader``: uniform random token ids of the vocabulary
(``torch.randint``, fixed seed), labels shifted by one, positions 0..seq-1; a tokenizer that only
reports the vocabulary size (nothing downloaded or read); no checkpoints, TensorBoard, wandb,
structured trace logs or flight-recorder dumps (a temporary dump folder, removed). ``settings``
in the result records what ran.

Numbers: ``tokens_per_s`` is the median, over the steps after ``--skip``, of torchtitan's own
per-step ``throughput(tps)`` (``MetricsProcessor.log`` at ``log_freq`` 1: the step's tokens over
the wall time since the previous step's log, which waits for the loss on the host), read by a
metric logger of this file that keeps each step's metrics (0.3.0: a ``MetricsProcessor``
subclass registered through its Config; 0.2.2: the TrainSpec's metrics builder).
``peak_memory_gib`` is the largest per-step ``torch.cuda.max_memory_allocated`` (the caching
allocator's peak of allocated bytes, read before torchtitan resets the peak each step, so the
maximum covers everything from the model's materialisation on; a CPU run: the worker's peak
RSS); ``peak_reserved_gib`` the same of ``max_memory_reserved``. ``time_to_first_step_s``: from
this process's start (``/proc``) to the end of step 1's log (imports, distributed init, model
build, compilation, CUDA-graph capture, the step); ``first_step_s`` from the first batch's fetch
to that point; ``compile_s`` that minus the median step time (an estimate).

torchtitan 0.3.0 on torch 2.11 (the GPU machine's): it targets a newer torch. (1) Its
``torchtitan.distributed.fsdp`` and ``full_dtensor`` modules import ``DataParallelMeshDims`` from
``torch.distributed.fsdp`` (torch 2.12+), so ``torchtitan.train`` fails to import: ``ImportError:
cannot import name 'DataParallelMeshDims' from 'torch.distributed.fsdp'``. On one GPU nothing
builds one (``parallelize_llama`` passes ``dp_mesh_dims=None``; ``resolve_fsdp_mesh`` returns
None for a 1-rank mesh), so this runner puts a placeholder there that raises if built
(``--no-shim``: without it). (2) Its attention masks call ``create_block_mask(...,
separate_full_blocks=True)``, an argument torch 2.11 lacks: step 1 fails with ``TypeError:
create_block_mask() got an unexpected keyword argument 'separate_full_blocks'`` (its varlen
backend passes ``enable_gqa``/``num_splits``, unknown to torch 2.11's ``varlen_attn``, and it
refuses SDPA for language models). (3) After step 1 ``Trainer.train`` calls
``torch.distributed.set_timeout`` (not in torch 2.11, nor 2.12): ``AttributeError``. So by
default a 0.3.0 run reports (2), torchtitan's own error line. ``--compat`` adapts both calls:
``separate_full_blocks=True`` dropped (torch 2.11's ``create_block_mask`` always keeps full
blocks apart, the same mask) and ``set_timeout`` a no-op (it only shortens the process-group
timeout after step 1); the result is named ``torchtitan 0.3.0 (torch-2.11 compat)``. (4) With
one FSDP unit ``[norm, lm_head]``, its ``ChunkedLossWrapper`` reshards ``lm_head``'s unit before
the decoder backward reaches ``norm`` and the backward fails with ``RuntimeError: The tensor has
a non-zero number of elements, but its data is not allocated yet.`` (torch 2.11 and 2.12; torch
PR 180428, torchtitan PR 3229), hence ``--loss ce``. 0.2.2, the newest release before it, runs
on torch 2.11 unmodified.

``datasets`` (Hugging Face; with pyarrow and pandas some 60 MiB of wheels) is imported at import
time by ``torchtitan.hf_datasets.text_datasets`` and used only by its text dataloaders, which
this run replaces: ``bench/stubs/for-torchtitan/datasets`` stands in, appended to ``sys.path``
by the worker alone (an installed ``datasets`` wins). The wheels: ``bench/torchtitan-wheels.txt``
(0.3.0 is installed with them; another version is unpacked from its wheel under
``.whl-torchtitan/`` when asked for).

    python bench/peers_torchtitan.py --model d_model=2048,n_layers=16,n_heads=32,n_kv_heads=8,\
ffn_dim=8192,vocab_size=128256 --batch-size 8 --seq-len 2048 --param-dtype float32 \
--remat none --steps 15 --skip 3 --out result.json [--compat | --torchtitan-version 0.2.2]
    python bench/peers_torchtitan.py --device cpu --compat --attention sdpa --model d_model=64,\
n_layers=2,n_heads=4,n_kv_heads=2,ffn_dim=128,vocab_size=512 --batch-size 2 --seq-len 64 \
--steps 4 --skip 1 --out /tmp/tt.json          # a CPU smoke run (gloo; FlexAttention has no
                                                # CPU backward)

On failure the file holds ``{"error": ...}``: the last error line of torchtitan's exception
(else of the worker's output), and the exit code is not 0.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

STARTED = time.time()
BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
STUBS = BENCH / "stubs" / "for-torchtitan"
WHEELS = REPO / ".whl-torchtitan"
SHAPE_KEYS = ("d_model", "n_layers", "n_heads", "n_kv_heads", "ffn_dim", "vocab_size")
REMAT = ("none", "dots", "dots-attention", "full")
# Titan's defaults (titan/config.py, titan/optimizer.py)
LR, WARMUP, MIN_LR_RATIO, WEIGHT_DECAY, GRAD_CLIP = 3e-3, 30, 0.1, 0.1, 1.0
BETAS, EPS = (0.9, 0.95), 1e-8
COMPAT_NAME = " (torch-2.11 compat)"


def process_start_time() -> float:
    """This process's start (Unix time) from ``/proc``, else the time this module began."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        btime = next(
            int(line.split()[1])
            for line in Path("/proc/stat").read_text().splitlines()
            if line.startswith("btime ")
        )
        return min(btime + ticks / os.sysconf("SC_CLK_TCK"), STARTED)
    except (OSError, ValueError, IndexError, StopIteration):
        return STARTED


def parse_model(text: str) -> dict[str, int]:
    model = dict(item.split("=", 1) for item in text.split(",") if "=" in item)
    if set(model) != set(SHAPE_KEYS):
        raise argparse.ArgumentTypeError(f"--model needs exactly {', '.join(SHAPE_KEYS)}")
    return {k: int(model[k]) for k in SHAPE_KEYS}


def error_line(text: str) -> str:
    """The last line of ``text`` naming an error, else its last line (bench/peers.py's rule),
    leaving out the source lines that torch.compile appends (``from user code:``)."""
    text = re.split(r"\n(?:from user code:|Set TORCHDYNAMO_VERBOSE)", text)[0]
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()] or [""]
    errors = [line for line in lines if re.search(r"(Error|Exception|error:)", line)]
    return (errors or lines)[-1][:1000]


def median(values: list[float]) -> float:
    ordered, mid = sorted(values), len(values) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


# ------------------------------------------------------------------ the worker (torchtitan) --


def _cpu_device_module() -> Any:
    """``torch.cpu`` with the memory and property calls torchtitan makes of a device module."""
    import types

    import torch

    module = types.ModuleType("torchtitan_peer_cpu_device")
    module.__dict__.update({k: getattr(torch.cpu, k) for k in dir(torch.cpu) if k[0] != "_"})
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    props = types.SimpleNamespace(name="cpu", total_memory=total, major=0, minor=0)
    module.__dict__.update(
        get_device_name=lambda *a, **k: "cpu",
        get_device_properties=lambda *a, **k: props,
        current_device=lambda: 0,
        memory_stats=lambda *a, **k: {},
        reset_peak_memory_stats=lambda *a, **k: None,
        empty_cache=lambda: None,
    )
    return module


def _torchtitan_path(args, unpack_root: str) -> str:
    """Puts the wanted torchtitan on ``sys.path`` (the installed one, else its wheel, unpacked
    from under ``.whl-torchtitan/``); returns its version."""
    import importlib.metadata
    import zipfile

    try:
        installed = importlib.metadata.version("torchtitan")
    except importlib.metadata.PackageNotFoundError:
        installed = None
    if installed == args.torchtitan_version:
        return installed
    wheels = sorted(args.torchtitan_wheels.rglob(f"torchtitan-{args.torchtitan_version}-*.whl"))
    if not wheels:
        raise ModuleNotFoundError(
            f"torchtitan {args.torchtitan_version}: not installed (found {installed}) and no "
            f"torchtitan-{args.torchtitan_version}-*.whl under {args.torchtitan_wheels}"
        )
    with zipfile.ZipFile(wheels[0]) as wheel:
        wheel.extractall(unpack_root)
    sys.path.insert(0, unpack_root)
    importlib.invalidate_caches()
    return args.torchtitan_version


def _prepare(args, version: str) -> list[str]:
    """Environment and the shims torchtitan needs before it is imported; returns their names."""
    shims = []
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    if "MASTER_PORT" not in os.environ:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = str(s.getsockname()[1])
    import torch
    import torch._utils

    if args.device == "cpu":  # torchtitan takes "cuda" when no accelerator is found
        cpu_module = _cpu_device_module()
        get_module = torch._utils._get_device_module
        torch._utils._get_available_device_type = lambda: "cpu"
        torch._utils._get_device_module = lambda t: cpu_module if t == "cpu" else get_module(t)
        shims.append("cpu device module (--device cpu)")
    if not version.startswith("0.3"):
        return shims
    import torch.distributed as dist
    import torch.distributed.fsdp as fsdp
    import torch.nn.attention.flex_attention as flex

    if not args.no_shim and not hasattr(fsdp, "DataParallelMeshDims"):

        class DataParallelMeshDims:
            """Placeholder for torch 2.12's class; torchtitan's one-GPU path never builds it."""

            def __init__(self, *args: Any, **kwargs: Any) -> None:
                raise NotImplementedError(
                    f"torch {torch.__version__} has no torch.distributed.fsdp."
                    "DataParallelMeshDims (a placeholder of bench/peers_torchtitan.py)"
                )

        fsdp.DataParallelMeshDims = DataParallelMeshDims  # type: ignore[attr-defined]
        shims.append("torch.distributed.fsdp.DataParallelMeshDims: a placeholder, never built")
    if not args.compat:
        return shims
    import inspect

    if "separate_full_blocks" not in inspect.signature(flex.create_block_mask).parameters:
        create_block_mask = flex.create_block_mask

        def create_block_mask_compat(*a: Any, separate_full_blocks: bool = True, **kw: Any):
            """torch 2.11 keeps full blocks apart always (``separate_full_blocks=True``)."""
            if not separate_full_blocks:
                raise NotImplementedError("separate_full_blocks=False needs a newer torch")
            return create_block_mask(*a, **kw)

        flex.create_block_mask = create_block_mask_compat
        shims.append("create_block_mask(separate_full_blocks=True): the argument dropped")
    if not hasattr(dist, "set_timeout"):
        dist.set_timeout = lambda timeout, group=None: None  # type: ignore[attr-defined]
        shims.append("torch.distributed.set_timeout (after step 1): a no-op")
    return shims


def _synthetic(state: dict[str, Any], vocab: int, seq_len: int, batch: int, seed: int):
    """An endless iterator of ({"input", "positions"}, labels) of uniform random ids."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    positions = torch.arange(seq_len).expand(batch, -1).contiguous()
    state["batches"] = 0
    while True:
        if state["batches"] == 0:
            state["first_batch_time"] = time.time()
        ids = torch.randint(vocab, (batch, seq_len + 1), generator=generator)
        state["batches"] += 1
        yield {"input": ids[:, :-1], "positions": positions}, ids[:, 1:]


def _recorder(base: type, state: dict[str, Any], cuda: bool) -> Any:
    """A torchtitan metric logger keeping each step's metrics (and the allocator's peaks,
    read before torchtitan resets them)."""
    import torch

    class StepRecorder(base):  # type: ignore[misc, valid-type]
        def __init__(self, processor: Any) -> None:
            self.processor = processor

        def log(self, metrics: dict[str, Any], step: int) -> None:
            record = {"step": step, "time": time.time(), **metrics}
            if cuda:
                record["max_memory_allocated"] = torch.cuda.max_memory_allocated()
                record["max_memory_reserved"] = torch.cuda.max_memory_reserved()
            if step == 1:
                parts = self.processor.model_parts or []
                params = {id(p): p.numel() for part in parts for p in part.parameters()}
                state["settings"]["parameters"] = sum(params.values())
                flops = self.processor.num_flops_per_token
                state["settings"]["flops_per_token_torchtitan"] = flops
            state["steps"].append(record)

        def close(self) -> None:
            pass

    return StepRecorder


def _matched_flavor(args, configs: dict[str, Any]) -> tuple[str, bool] | None:
    """torchtitan 0.3.0's llama3 flavor of ``--model``'s shape, and whether it ties."""
    wanted = tuple(args.model[k] for k in SHAPE_KEYS)
    for name, flavor in configs.items():
        cfg = flavor(attn_backend="flex")
        attention = cfg.layers[0].attention
        shape = (
            cfg.dim,
            len(cfg.layers),
            attention.n_heads,
            attention.n_kv_heads or attention.n_heads,
            cfg.layers[0].feed_forward.w1.out_features,
            cfg.vocab_size,
        )
        if shape == wanted:
            return name, cfg.enable_weight_tying
    return None


def _run_v03(args, state: dict[str, Any], dump_folder: str) -> None:
    """torchtitan 0.3.x: a config function, through ``--module``/``--config``."""
    from dataclasses import dataclass

    import torchtitan.models.llama3 as tt_llama3
    import torchtitan.train
    from torchtitan.components.checkpoint import CheckpointManager
    from torchtitan.components.dataloader import BaseDataLoader
    from torchtitan.components.loss import ChunkedLossWrapper, CrossEntropyLoss
    from torchtitan.components.metrics import BaseLogger, MetricsProcessor
    from torchtitan.components.optimizer import LRSchedulersContainer, OptimizersContainer
    from torchtitan.components.optimizer.optimizer import ParamGroupConfig
    from torchtitan.components.tokenizer import BaseTokenizer
    from torchtitan.config import (
        CommConfig,
        CompileConfig,
        DebugConfig,
        ParallelismConfig,
        TrainingConfig,
    )
    from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC
    from torchtitan.models.common import ComplexRoPE, Embedding, Linear, RMSNorm
    from torchtitan.models.common.attention import ScaledDotProductAttention
    from torchtitan.trainer import Trainer

    m, cuda = args.model, args.device == "cuda"
    matched = _matched_flavor(args, tt_llama3.llama3_configs)
    tie = {"yes": True, "no": False}.get(args.tie_embeddings, bool(matched and matched[1]))

    def titan_peer(attn_backend: str = "flex", tp_gemm_backend: Any = "default") -> Any:
        d, vocab, heads = m["d_model"], m["vocab_size"], m["n_heads"]
        config = tt_llama3.Llama3Model.Config(
            dim=d,
            vocab_size=vocab,
            enable_weight_tying=tie,
            tok_embeddings=Embedding.Config(
                num_embeddings=vocab,
                embedding_dim=d,
                param_init=tt_llama3._EMBEDDING_SKIP_INIT if tie else tt_llama3._EMBEDDING_INIT,
            ),
            norm=RMSNorm.Config(normalized_shape=d, param_init=tt_llama3._NORM_INIT),
            lm_head=Linear.Config(
                in_features=d, out_features=vocab, param_init=tt_llama3._output_linear_init(d)
            ),
            layers=tt_llama3._build_llama3_layers(
                fuse_qkv=True,
                n_layers=m["n_layers"],
                dim=d,
                n_heads=heads,
                n_kv_heads=m["n_kv_heads"],
                hidden_dim=m["ffn_dim"],
                rope=ComplexRoPE.Config(
                    dim=d // heads, max_seq_len=131072, theta=500000, scaling="none"
                ),
                attn_backend=attn_backend,
                tp_gemm_backend=tp_gemm_backend,
            ),
        )
        if args.attention == "sdpa":  # torchtitan's maskless SDPA module (causal)
            for layer in config.layers:
                layer.attention.inner_attention = ScaledDotProductAttention.Config()
        return config

    tt_llama3.llama3_configs["titan_peer"] = titan_peer

    class SyntheticTokenizer(BaseTokenizer):
        """Reports the vocabulary size; random ids need no tokenizer files."""

        @dataclass(kw_only=True, slots=True)
        class Config(BaseTokenizer.Config):
            vocab_size: int = 0

        def __init__(self, config: Config, *, tokenizer_path: str = "") -> None:
            super().__init__()
            self.vocab_size = config.vocab_size

        def encode(self, *args: Any, **kwargs: Any) -> list[int]:
            raise NotImplementedError("synthetic tokens: nothing to encode")

        def decode(self, *args: Any, **kwargs: Any) -> str:
            raise NotImplementedError("synthetic tokens: nothing to decode")

        def get_vocab_size(self) -> int:
            return self.vocab_size

    class SyntheticDataLoader(BaseDataLoader):
        """Uniform random token ids, one document per row (positions 0..seq-1)."""

        @dataclass(kw_only=True, slots=True)
        class Config(BaseDataLoader.Config):
            vocab_size: int = 0
            seed: int = 0

        def __init__(self, config: Config, *, seq_len: int, local_batch_size: int, **_: Any):
            self.batches = _synthetic(
                state, config.vocab_size, seq_len, local_batch_size, config.seed
            )

        def __iter__(self):
            return self.batches

        def state_dict(self) -> dict[str, Any]:
            return {}

        def load_state_dict(self, state_dict: dict[str, Any]) -> None:
            pass

    recorder = _recorder(BaseLogger, state, cuda)

    class RecordingMetrics(MetricsProcessor):
        @dataclass(kw_only=True, slots=True)
        class Config(MetricsProcessor.Config):
            pass

        def _build_metric_logger(self, **kwargs: Any) -> Any:
            return recorder(self)

    def titan_peer_config() -> Any:
        model_spec = tt_llama3.model_registry("titan_peer", attn_backend="flex")
        group = {"lr": args.lr, "betas": BETAS, "eps": EPS, "weight_decay": 0.0}
        cross_entropy = CrossEntropyLoss.Config(global_vocab_size=m["vocab_size"])
        return Trainer.Config(
            model_spec=model_spec,
            hf_assets_path=dump_folder,
            dump_folder=dump_folder,
            tokenizer=SyntheticTokenizer.Config(vocab_size=m["vocab_size"]),
            dataloader=SyntheticDataLoader.Config(vocab_size=m["vocab_size"], seed=args.seed),
            loss=(
                ChunkedLossWrapper.Config(loss_fn=cross_entropy)
                if args.loss == "chunked"
                else cross_entropy
            ),
            optimizer=OptimizersContainer.Config(
                param_groups=[
                    ParamGroupConfig(
                        pattern=r".*norm.*", optimizer_name="AdamW", optimizer_kwargs=group
                    ),
                    ParamGroupConfig(
                        pattern=r".*",
                        optimizer_name="AdamW",
                        optimizer_kwargs={**group, "weight_decay": WEIGHT_DECAY},
                    ),
                ],
                implementation="fused",
            ),
            lr_scheduler=LRSchedulersContainer.Config(
                warmup_steps=WARMUP, decay_type="cosine", min_lr_factor=MIN_LR_RATIO
            ),
            training=TrainingConfig(
                local_batch_size=args.batch_size,
                seq_len=args.seq_len,
                steps=args.steps,
                max_norm=GRAD_CLIP,
                dtype=args.param_dtype,
                mixed_precision_param="bfloat16",
                mixed_precision_reduce="float32",
                disable_cuda_graphs=not (cuda and args.cuda_graphs),
            ),
            parallelism=ParallelismConfig(),
            compile=CompileConfig(enable=not args.no_compile, components=["model", "loss"]),
            activation_checkpoint={"none": None, "full": FullAC.Config()}.get(
                args.remat, SelectiveAC.Config()
            ),
            metrics=RecordingMetrics.Config(log_freq=1),
            checkpoint=CheckpointManager.Config(enable=False),
            comm=CommConfig(trace_buf_size=0),
            debug=DebugConfig(seed=args.seed, enable_structured_logging=False),
        )

    sys.modules["__main__"].titan_peer_config = titan_peer_config  # type: ignore[attr-defined]
    state["settings"].update(
        matched_flavor=matched[0] if matched else None,
        tied_embeddings=tie,
        rope="theta 500000, no frequency scaling",
        attention=(
            "FlexAttention, block-causal mask, one document per row (= causal)"
            if args.attention == "flex"
            else "ScaledDotProductAttention, is_causal (cuDNN, flash, math)"
        ),
        loss="CrossEntropyLoss" if args.loss == "ce" else "ChunkedLossWrapper(CrossEntropy)",
        precision=(
            "training.dtype float32; FSDP2 MixedPrecisionPolicy(param bfloat16, reduce "
            "float32) on a 1-rank mesh (parallelize_llama's fully_shard, dp_shard 1)"
            if args.param_dtype == "float32"
            else "training.dtype bfloat16: bf16 parameters, gradients and AdamW state"
        ),
        activation_checkpoint={"none": "none", "full": "FullAC"}.get(
            args.remat, "SelectiveAC (per-op: matmuls but every second, attention kernels)"
        ),
        optimizer=(
            f"AdamW fused, lr {args.lr}, betas {BETAS}, eps {EPS}, weight decay "
            f"{WEIGHT_DECAY} but on norms"
        ),
        spmd_backend="spmd_types (its default)",
        cuda_graphs=cuda and args.cuda_graphs,
    )
    sys.argv = [sys.argv[0], "--module", "__main__", "--config", "titan_peer_config"]
    sys.argv += shlex.split(args.torchtitan_args)
    torchtitan.train.main()


def _run_v02(args, state: dict[str, Any], dump_folder: str) -> None:
    """torchtitan 0.2.x: a TrainSpec, through ``--model.name`` and its command line."""
    # first: its ConfigManager.parse_args takes sys.argv[1:] as a default bound at import
    ac = {"none": ["none"], "full": ["full"]}.get(args.remat, ["selective", "op"])
    sys.argv = [sys.argv[0], "--model.name", "titan_peer", "--model.flavor", "titan_peer"]
    sys.argv += ["--model.hf_assets_path", dump_folder, "--job.dump_folder", dump_folder]
    sys.argv += ["--training.local_batch_size", str(args.batch_size)]
    sys.argv += ["--training.seq_len", str(args.seq_len), "--training.steps", str(args.steps)]
    sys.argv += ["--training.max_norm", str(GRAD_CLIP), "--training.dtype", args.param_dtype]
    sys.argv += ["--training.mixed_precision_param", "bfloat16"]
    sys.argv += ["--activation_checkpoint.mode", ac[0]]
    sys.argv += ["--activation_checkpoint.selective_ac_option", ac[-1]] if len(ac) > 1 else []
    sys.argv += [] if args.no_compile else ["--compile.enable"]
    sys.argv += ["--compile.components", "model,loss"]
    sys.argv += ["--optimizer.name", "AdamW", "--optimizer.lr", str(args.lr)]
    sys.argv += ["--optimizer.beta1", str(BETAS[0]), "--optimizer.beta2", str(BETAS[1])]
    sys.argv += ["--optimizer.eps", str(EPS), "--optimizer.weight_decay", str(WEIGHT_DECAY)]
    sys.argv += ["--optimizer.implementation", "fused"]
    sys.argv += ["--lr_scheduler.warmup_steps", str(WARMUP)]
    sys.argv += ["--lr_scheduler.decay_type", "cosine"]
    sys.argv += ["--lr_scheduler.min_lr_factor", str(MIN_LR_RATIO)]
    sys.argv += ["--metrics.log_freq", "1", "--comm.trace_buf_size", "0"]
    sys.argv += ["--debug.seed", str(args.seed), *shlex.split(args.torchtitan_args)]
    import dataclasses

    import torchtitan.models.llama3 as tt_llama3
    import torchtitan.train
    from torchtitan.components.dataloader import BaseDataLoader
    from torchtitan.components.metrics import BaseLogger, MetricsProcessor
    from torchtitan.components.tokenizer import BaseTokenizer
    from torchtitan.protocols.train_spec import register_train_spec

    m, cuda = args.model, args.device == "cuda"
    hidden = int(2 * 4 * m["d_model"] / 3)  # its FeedForward: rounded up to multiple_of
    tt_llama3.llama3_args["titan_peer"] = tt_llama3.TransformerModelArgs(
        dim=m["d_model"],
        n_layers=m["n_layers"],
        n_heads=m["n_heads"],
        n_kv_heads=m["n_kv_heads"],
        vocab_size=m["vocab_size"],
        multiple_of=m["ffn_dim"],
        ffn_dim_multiplier=m["ffn_dim"] / hidden,
        rope_theta=500000,
        attn_type=args.attention,
        attn_mask_type="causal",
    )

    class SyntheticTokenizer(BaseTokenizer):
        def __init__(self) -> None:
            super().__init__()

        def encode(self, *args: Any, **kwargs: Any) -> list[int]:
            raise NotImplementedError("synthetic tokens: nothing to encode")

        def decode(self, *args: Any, **kwargs: Any) -> str:
            raise NotImplementedError("synthetic tokens: nothing to decode")

        def get_vocab_size(self) -> int:
            return m["vocab_size"]

    class SyntheticDataLoader(BaseDataLoader):
        def __init__(self, job_config: Any) -> None:
            training = job_config.training
            self.batches = _synthetic(
                state, m["vocab_size"], training.seq_len, training.local_batch_size, args.seed
            )

        def __iter__(self):
            for inputs, labels in self.batches:  # its sdpa model takes no positions
                yield ({"input": inputs["input"]}, labels)

        def state_dict(self) -> dict[str, Any]:
            return {}

        def load_state_dict(self, state_dict: dict[str, Any]) -> None:
            pass

    recorder = _recorder(BaseLogger, state, cuda)

    def build_metrics(job_config: Any, parallel_dims: Any, *a: Any, **k: Any) -> Any:
        processor = MetricsProcessor(job_config, parallel_dims)
        processor.logger = recorder(processor)
        return processor

    register_train_spec(
        "titan_peer",
        dataclasses.replace(
            tt_llama3.get_train_spec(),
            build_tokenizer_fn=lambda job_config: SyntheticTokenizer(),
            build_dataloader_fn=lambda job_config, **_: SyntheticDataLoader(job_config),
            build_metrics_processor_fn=build_metrics,
            build_validator_fn=None,
        ),
    )
    state["settings"].update(
        matched_flavor=None,
        tied_embeddings=False,
        rope="theta 500000, Llama 3.1 frequency scaling (always on in 0.2.2)",
        attention=(
            "ScaledDotProductAttention, causal (its llama3 default)"
            if args.attention == "sdpa"
            else "FlexAttention, causal mask"
        ),
        loss="its cross-entropy (sum over tokens / tokens)",
        precision=(
            "training.dtype float32; torch.autocast(bfloat16) (0.2.2 applies no FSDP on one "
            "GPU: its maybe_enable_amp)"
            if args.param_dtype == "float32"
            else "training.dtype bfloat16: bf16 parameters, gradients and AdamW state"
        ),
        activation_checkpoint={"none": "none", "full": "full"}.get(
            args.remat, "selective, selective_ac_option op (per-op SAC)"
        ),
        optimizer=f"AdamW fused, lr {args.lr}, betas {BETAS}, eps {EPS}, weight decay "
        f"{WEIGHT_DECAY} on all parameters",
        cuda_graphs=False,
        torchtitan_argv=shlex.join(sys.argv[1:]),
    )
    torchtitan.train.main(torchtitan.train.Trainer)


def worker(args) -> int:
    """Train with torchtitan in this process; write the step records to ``args.worker``."""
    state: dict[str, Any] = {"steps": [], "settings": {}}
    try:  # end with the parent, should a caller's timeout kill it (Linux: PR_SET_PDEATHSIG)
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)
        if os.getppid() == 1:
            return 1
    except (OSError, AttributeError):
        pass
    try:
        with tempfile.TemporaryDirectory(prefix="torchtitan-peer-") as tmp:
            # bench/ would shadow modules named like its scripts; the stubs go last
            sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != BENCH]
            sys.path.append(str(STUBS))
            version = _torchtitan_path(args, str(Path(tmp, "site")))
            state["settings"]["shims"] = _prepare(args, version)
            import torch

            dump_folder = str(Path(tmp, "dump"))
            Path(dump_folder).mkdir()
            run = _run_v03 if version.startswith("0.3") else _run_v02
            state["settings"].update(
                torchtitan=version,
                torch=torch.__version__,
                device=torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
            )
            run(args, state, dump_folder)
        out = {k: state[k] for k in ("steps", "settings", "first_batch_time") if k in state}
        if args.device == "cpu":
            import resource

            out["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        Path(args.worker).write_text(json.dumps(out, default=str))
        return 0
    except BaseException as err:  # noqa: B036 - every failure becomes the peer's error line
        import traceback

        traceback.print_exc()
        sys.stdout.flush()
        text = "".join(traceback.format_exception_only(type(err), err))
        Path(args.worker).write_text(
            json.dumps({"error": error_line(text), "settings": state["settings"]}, default=str)
        )
        return 1


# ----------------------------------------------------------------- the parent (this process) --


def summarize(args, record: dict[str, Any], started: float) -> dict[str, Any]:
    steps = record["steps"]
    if len(steps) < args.steps:
        raise RuntimeError(f"torchtitan logged {len(steps)} of {args.steps} steps")
    tps = median([s["throughput(tps)"] for s in steps[args.skip :]])
    first_step_s = steps[0]["time"] - record["first_batch_time"]
    if args.device == "cuda":
        peak = max(s["max_memory_allocated"] for s in steps) / 2**30
        reserved = max(s["max_memory_reserved"] for s in steps) / 2**30
        memory = "torch.cuda.max_memory_allocated, the largest of the steps"
    else:
        peak, reserved = record["peak_rss_bytes"] / 2**30, None
        memory = "the worker's peak RSS (a CPU run)"
    mfu = [s["mfu(%)"] for s in steps[args.skip :] if s.get("mfu(%)") is not None]
    settings = record["settings"]
    version = settings.get("torchtitan", args.torchtitan_version)
    compat = any("set_timeout" in s or "create_block_mask" in s for s in settings["shims"])
    settings = {
        "model": ",".join(f"{k}={args.model[k]}" for k in SHAPE_KEYS),
        **settings,
        "batch_size": args.batch_size,
        "seq_len": args.seq_len,
        "param_dtype": args.param_dtype,
        "remat": args.remat,
        "compile": None if args.no_compile else "torch.compile: model (per block), loss",
        "lr_schedule": f"linear warmup {WARMUP} steps (cut to the run), cosine to "
        f"{MIN_LR_RATIO} x lr; clip {GRAD_CLIP}",
        "data": "uniform random token ids (torch.randint), a synthetic dataloader",
        "steps": args.steps,
        "skip": args.skip,
        "tokens_per_s_source": "median of torchtitan's per-step throughput(tps) after --skip",
        "memory_source": memory,
        "torchtitan_mfu_pct": median(mfu) if mfu else None,
        "losses": [round(s["loss_metrics/global_avg_loss"], 4) for s in steps],
    }
    return {
        "system": f"torchtitan {version}" + (COMPAT_NAME if compat else ""),
        "tokens_per_s": tps,
        "peak_memory_gib": peak,
        "peak_reserved_gib": reserved,
        "time_to_first_step_s": steps[0]["time"] - started,
        "first_step_s": first_step_s,
        "compile_s": max(first_step_s - args.batch_size * args.seq_len / tps, 0.0),
        "compile": not args.no_compile,
        "settings": settings,
        "command": shlex.join(["python", "bench/peers_torchtitan.py", *sys.argv[1:]]),
    }


def run_worker(args) -> tuple[int, bool, str]:
    """The worker as a child process, its output passed on; (exit code, timed out, output)."""
    command = [sys.executable, str(Path(__file__).resolve()), *sys.argv[1:]]
    command += ["--worker", str(args.record)]
    tail: collections.deque[str] = collections.deque(maxlen=400)
    proc = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        errors="replace", start_new_session=True,
    )  # fmt: skip

    def relay() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            sys.stdout.write(line)
            tail.append(line)

    reader = threading.Thread(target=relay, daemon=True)
    reader.start()
    try:
        code, timed_out = proc.wait(timeout=args.timeout), False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        code, timed_out = proc.wait(), True
    except KeyboardInterrupt:
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    reader.join(timeout=10)
    sys.stdout.flush()
    return code, timed_out, "".join(tail)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=parse_model, required=True, help=",".join(SHAPE_KEYS))
    parser.add_argument("--batch-size", type=int, required=True)
    parser.add_argument("--seq-len", type=int, required=True)
    parser.add_argument("--param-dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--remat", choices=REMAT, default="none")
    parser.add_argument("--steps", type=int, default=15)
    parser.add_argument("--skip", type=int, default=3, help="first steps not timed")
    parser.add_argument("--out", type=Path, required=True, help="the JSON result")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument(
        "--torchtitan-version",
        default="0.3.0",
        help="the installed one, else unpacked from its wheel (--torchtitan-wheels)",
    )
    parser.add_argument(
        "--torchtitan-wheels",
        type=Path,
        default=WHEELS,
        help="where a torchtitan wheel of --torchtitan-version is looked for",
    )
    parser.add_argument(
        "--compat",
        action="store_true",
        help="0.3.0 on torch 2.11: adapt its create_block_mask and set_timeout calls",
    )
    parser.add_argument(
        "--attention",
        choices=("flex", "sdpa"),
        help="default: the version's llama3 default (0.3.0 flex, 0.2.2 sdpa); a CPU run needs "
        "sdpa (FlexAttention has no CPU backward)",
    )
    parser.add_argument(
        "--loss",
        choices=("ce", "chunked"),
        default="ce",
        help="0.3.0: ce, its CrossEntropyLoss; chunked, its ChunkedLossWrapper (fails in the "
        "first backward with one FSDP unit [norm, lm_head])",
    )
    parser.add_argument("--lr", type=float, default=LR, help="Titan's default")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--tie-embeddings",
        choices=("auto", "yes", "no"),
        default="auto",
        help="0.3.0; auto: as torchtitan's flavor of this shape (1B and 3B tie), else untied",
    )
    parser.add_argument(
        "--no-cuda-graphs", dest="cuda_graphs", action="store_false", help="0.3.0's are on"
    )
    parser.add_argument("--no-compile", action="store_true", help="for debugging")
    parser.add_argument("--no-shim", action="store_true", help="no DataParallelMeshDims stand-in")
    parser.add_argument(
        "--torchtitan-args", default="", help="more options for torchtitan's command line"
    )
    parser.add_argument("--timeout", type=float, default=1200, help="seconds for the worker")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.steps <= args.skip:
        parser.error("--steps must exceed --skip")
    if args.attention is None:
        args.attention = "flex" if args.torchtitan_version.startswith("0.3") else "sdpa"
    if args.worker:
        return worker(args)

    started = process_start_time()
    with tempfile.TemporaryDirectory(prefix="torchtitan-peer-out-") as tmp:
        args.record = Path(tmp, "record.json")
        code, timed_out, output = run_worker(args)
        record = json.loads(args.record.read_text()) if args.record.exists() else {}
    name = f"torchtitan {args.torchtitan_version}" + (COMPAT_NAME if args.compat else "")
    if timed_out:
        result: dict[str, Any] = {"error": f"timeout after {args.timeout:.0f} s"}
    elif code != 0 or "error" in record or not record:
        result = {"error": record.get("error") or f"exit {code}: {error_line(output)}"}
    else:
        try:
            result = summarize(args, record, started)
        except (KeyError, RuntimeError, ValueError, ZeroDivisionError) as err:
            result = {"error": f"{type(err).__name__}: {err}"}
    if "error" in result:
        result.update(system=name, settings=record.get("settings", {}))
        result["command"] = shlex.join(["python", "bench/peers_torchtitan.py", *sys.argv[1:]])
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "settings"}), flush=True)
    return 0 if "error" not in result else (code or 1)


if __name__ == "__main__":
    raise SystemExit(main())
