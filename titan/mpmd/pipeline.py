"""Single-controller MPMD pipeline: stages as separate jitted programs on separate device groups.

The model is cut into chunks (:func:`titan.trainer.layout.plan_chunks`); chunk c runs on device
group c % pp, a sub-mesh partitioned by Shardy with the same logical sharding rules as the SPMD
baseline. For each chunk, compiled once per shape:

- ``forward(params, inputs, segment_ids, targets) -> (outputs, vjp)``: the chunk's forward with
  ``jax.vjp``; the returned VJP object carries the residuals (saved activations) on the group's
  devices until the backward consumes them. The last chunk outputs the microbatch's mean loss.
- ``backward(vjp, dy, grads) -> (grads + dW, dx)``: input and weight gradients, accumulated
  into float32 gradient buffers in the same program.
- ``backward_input(vjp, dy) -> dx`` and ``backward_weight(vjp, dy, grads) -> grads + dW`` for
  zero-bubble schedules: the same VJP with the unused half removed by XLA's dead-code
  elimination. Both walk the chain of activation gradients inside the chunk, so I + W cost more
  than B (the weight half re-derives the per-layer output gradients it needs).
- ``update(params, opt_state, grads, squared_norms) -> (params, opt_state, zeroed grads,
  global_norm)``: global-norm clipping with the norm over all chunks, then AdamW.

One Python process (the controller) walks the schedule (:mod:`titan.mpmd.schedules`) in a
dependency-respecting order and dispatches each action; JAX's asynchronous dispatch lets the
groups run concurrently. Activations and their gradients cross groups through :func:`transfer`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding, PartitionSpec

from titan.config import ModelConfig, TrainConfig
from titan.errors import TitanError
from titan.models.llama import LlamaStage
from titan.mpmd.schedules import (
    BACKWARD,
    BACKWARD_INPUT,
    BACKWARD_WEIGHT,
    FORWARD,
    Action,
    build_schedule,
    execution_order,
    theoretical_bubble,
)
from titan.observability.events import Event, Pipeline, PipelineTiming
from titan.ops import Ops
from titan.parallel.sharding import BATCH_AXES
from titan.trainer.layout import Chunk, MeshLayout, cast_tree
from titan.trainer.optimizer import clip_by_global_norm


def transfer(x: Any, sharding: NamedSharding) -> Any:
    """Move an activation (or its gradient) onto the receiving group's devices.

    The one place where data crosses device groups. ``jax.device_put`` returns at once and
    copies device to device when ``x`` is ready (NVLink/PCIe between GPUs of one host). It
    assumes the controller addresses both groups, true on one host; a multi-host pipeline
    replaces this function with a cross-process send/receive.
    """
    return jax.device_put(x, sharding)


def _squared_norm(tree: Any) -> jax.Array:
    return jnp.square(optax.tree.norm(tree))


def _abstract(tree: Any, shardings: Any) -> Any:
    return jax.tree.map(
        lambda leaf, s: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=s), tree, shardings
    )


@dataclass
class ChunkPrograms:
    """The compiled programs of one model chunk on its device group."""

    chunk: Chunk
    layout: MeshLayout
    model: LlamaStage
    tx: optax.GradientTransformation
    dtype: jnp.dtype
    grad_clip: float
    shardings: Any
    abstract: Any
    rows: int
    seq_len: int
    compiled: dict[str, Any] = field(default_factory=dict)

    @property
    def activation_sharding(self) -> NamedSharding:
        return NamedSharding(self.layout.mesh, PartitionSpec(BATCH_AXES, None, None))

    def _apply(self, params, inputs, segment_ids, targets):
        positions = jnp.broadcast_to(jnp.arange(self.seq_len), segment_ids.shape)
        outputs = self.model.apply(
            {"params": cast_tree(params, self.dtype)}, inputs, positions, segment_ids, targets
        )
        return jnp.mean(outputs) if self.chunk.last else outputs

    def _forward(self, params, inputs, segment_ids, targets):
        if self.chunk.first:
            return jax.vjp(lambda p: self._apply(p, inputs, segment_ids, targets), params)
        return jax.vjp(lambda p, x: self._apply(p, x, segment_ids, targets), params, inputs)

    def _backward(self, vjp, dy, grads):
        cotangents = vjp(dy)
        grads = jax.tree.map(jnp.add, grads, cotangents[0])
        return grads, (None if self.chunk.first else cotangents[1])

    def _backward_input(self, vjp, dy):
        return vjp(dy)[1]

    def _backward_weight(self, vjp, dy, grads):
        return jax.tree.map(jnp.add, grads, vjp(dy)[0])

    def _update(self, params, opt_state, grads, squared_norms):
        global_norm = jnp.sqrt(sum(squared_norms))
        grads = clip_by_global_norm(grads, global_norm, self.grad_clip)
        updates, opt_state = self.tx.update(grads, opt_state, params)
        zeros = jax.tree.map(jnp.zeros_like, grads)
        return optax.apply_updates(params, updates), opt_state, zeros, global_norm

    def _abstract_inputs(self) -> tuple[Any, Any, Any]:
        batch = self.layout.batch_sharding(self.rows)
        ids = jax.ShapeDtypeStruct((self.rows, self.seq_len), jnp.int32, sharding=batch)
        if self.chunk.first:
            inputs = ids
        else:
            shape = (self.rows, self.seq_len, self.model.config.d_model)
            inputs = jax.ShapeDtypeStruct(shape, self.dtype, sharding=self.activation_sharding)
        return inputs, ids, (ids if self.chunk.last else None)

    def _output_gradient_abstract(self) -> jax.ShapeDtypeStruct:
        if self.chunk.last:
            return jax.ShapeDtypeStruct((), jnp.float32, sharding=self.layout.replicated())
        shape = (self.rows, self.seq_len, self.model.config.d_model)
        return jax.ShapeDtypeStruct(shape, self.dtype, sharding=self.activation_sharding)

    def _zeros(self) -> Any:
        return jax.tree.map(lambda p: jnp.zeros(p.shape, p.dtype), self.abstract["params"])

    def compile(self, kinds: set[str], chunks: int) -> float:
        """Compile, ahead of time, the forward, the backward ``kinds`` the schedule uses, the
        gradient-buffer programs and the update (which takes the squared gradient norms of all
        ``chunks``). Returns seconds (trace + XLA compile)."""
        start = time.perf_counter()
        params, opt_state = self.abstract["params"], self.abstract["opt_state"]
        grad_shardings, replicated = self.shardings["params"], self.layout.replicated()
        grads = _abstract(params, grad_shardings)
        inputs, ids, targets = self._abstract_inputs()
        with self.layout.tracing():
            forward = jax.jit(self._forward).lower(params, inputs, ids, targets).compile()
        vjp, dy = forward.out_info[1], self._output_gradient_abstract()
        dx = None if self.chunk.first else self.activation_sharding
        scalar = jax.ShapeDtypeStruct((), jnp.float32, sharding=replicated)
        update_out = (grad_shardings, self.shardings["opt_state"], grad_shardings, replicated)
        programs = {
            BACKWARD: (self._backward, (grad_shardings, dx), 2, (vjp, dy, grads)),
            BACKWARD_INPUT: (self._backward_input, dx, (), (vjp, dy)),
            BACKWARD_WEIGHT: (self._backward_weight, grad_shardings, 2, (vjp, dy, grads)),
            "zeros": (self._zeros, grad_shardings, (), ()),
            "squared_norm": (_squared_norm, replicated, (), (grads,)),
            "update": (
                self._update,
                update_out,
                (0, 1, 2),
                (params, opt_state, grads, (scalar,) * chunks),
            ),
        }
        needed = (set(kinds) - {FORWARD}) | {"zeros", "squared_norm", "update"}
        if self.chunk.first:
            needed.discard(BACKWARD_INPUT)
        self.compiled = {FORWARD: forward}
        for name in sorted(needed):
            fn, out_shardings, donate, args = programs[name]
            jitted = jax.jit(fn, out_shardings=out_shardings, donate_argnums=donate)
            self.compiled[name] = jitted.lower(*args).compile()
        return time.perf_counter() - start


def _slice_chunk(full_params: dict[str, Any], chunk: Chunk) -> dict[str, Any]:
    params = {"layers": jax.tree.map(lambda x: x[chunk.start : chunk.end], full_params["layers"])}
    if chunk.first:
        params["embed"] = full_params["embed"]
    if chunk.last:
        params["final_norm"] = full_params["final_norm"]
        params["head"] = full_params["head"]
    return params


@dataclass
class _StepBuffers:
    """Per-step values in flight between actions, keyed by (chunk, microbatch)."""

    inputs: dict[tuple[int, int], Any] = field(default_factory=dict)
    vjps: dict[tuple[int, int], Any] = field(default_factory=dict)
    grads_in: dict[tuple[int, int], Any] = field(default_factory=dict)
    weight_dy: dict[tuple[int, int], Any] = field(default_factory=dict)
    losses: list = field(default_factory=list)


@dataclass
class PipelineTrainer:
    """MPMD layout: per-chunk programs, a schedule, and the controller that executes it.

    The state is ``{"step": int, "chunks": [{"params", "opt_state"}, ...]}`` with chunk c's
    arrays on group c % pp. Gradient buffers live on the trainer between steps.
    """

    cfg: TrainConfig
    model_cfg: ModelConfig
    ops: Ops
    layouts: list[MeshLayout]
    chunks: list[Chunk]
    programs: list[ChunkPrograms]
    tx: optax.GradientTransformation
    schedule_fn: optax.Schedule
    compute_dtype: jnp.dtype
    schedule: Any
    order: list[Action]
    _grads: list[Any] = field(default_factory=list)
    _loss_seed: Any = None
    _lr: Any = None
    _events: list = field(default_factory=list)
    _fields: dict[str, Any] = field(default_factory=dict)
    _steps_done: int = 0

    @classmethod
    def build(cls, cfg, model_cfg, ops, layouts, chunks, tx, schedule_fn, dtype) -> PipelineTrainer:
        """Validate the layout and build the programs (not compiled yet).

        Raises:
            TitanError: microbatch rows that do not split over a group's data x fsdp axes, or a
                parameter dimension that does not divide its mesh axis.
        """
        from titan.trainer.adapters import abstract_chunk_state, chunk_model

        rows = cfg.batch_size // cfg.microbatches
        mesh = layouts[0].mesh_shape
        if rows % (mesh["data"] * mesh["fsdp"]):
            raise TitanError(
                f"--batch-size {cfg.batch_size} / --microbatches {cfg.microbatches} = {rows} rows "
                f"per microbatch, not a multiple of a stage's dp x fsdp = {mesh['data']} x "
                f"{mesh['fsdp']} (--dp 0 takes the devices left: devices / (pp x fsdp x tp))"
            )
        schedule = build_schedule(cfg.schedule, cfg.pp, cfg.microbatches, cfg.virtual_stages)
        programs = []
        for chunk in chunks:
            model = chunk_model(cfg, model_cfg, ops, chunk)
            layout = layouts[chunk.group]
            shardings, abstract = abstract_chunk_state(model, layout, tx, cfg.seq_len)
            programs.append(
                ChunkPrograms(
                    chunk,
                    layout,
                    model,
                    tx,
                    dtype,
                    cfg.grad_clip,
                    shardings,
                    abstract,
                    rows,
                    cfg.seq_len,
                )
            )
        return cls(
            cfg,
            model_cfg,
            ops,
            layouts,
            chunks,
            programs,
            tx,
            schedule_fn,
            dtype,
            schedule,
            execution_order(schedule),
        )

    def describe(self) -> dict[str, Any]:
        """The layout as recorded in ``run_start`` and in checkpoints."""
        return {
            "layout": "mpmd",
            "pp": self.cfg.pp,
            "virtual_stages": self.cfg.virtual_stages,
            "microbatches": self.cfg.microbatches,
            "schedule": self.cfg.schedule,
            "stage_mesh": self.layouts[0].mesh_shape,
            "devices": sum(int(layout.mesh.devices.size) for layout in self.layouts),
            "chunks": [[c.start, c.end] for c in self.chunks],
        }

    def start_events(self) -> list[Event]:
        """The ``pipeline`` event: stages, devices and layers per stage, schedule, bubble."""
        return [
            Pipeline(
                stages=self.cfg.pp,
                virtual_stages=self.cfg.virtual_stages,
                devices_per_stage=int(self.layouts[0].mesh.devices.size),
                layers_per_chunk=[c.n_layers for c in self.chunks],
                chunk_stage=[c.group for c in self.chunks],
                schedule=self.cfg.schedule,
                microbatches=self.cfg.microbatches,
                theoretical_bubble=theoretical_bubble(
                    self.cfg.schedule,
                    self.cfg.pp,
                    self.cfg.microbatches,
                    self.cfg.virtual_stages,
                ),
                actions=[[str(a) for a in group] for group in self.schedule.groups],
            )
        ]

    def init_state(self, seed: int) -> dict[str, Any]:
        """Initialise the whole model on group 0 (the same values as the SPMD layout for the
        same seed), then move each chunk's slice to its group. Group 0 must hold the full
        float32 parameters once."""
        from titan.trainer.adapters import abstract_chunk_state, chunk_model, init_params

        whole = Chunk(0, 0, 0, self.model_cfg.n_layers, True, True)
        model = chunk_model(self.cfg, self.model_cfg, self.ops, whole)
        shardings, _ = abstract_chunk_state(model, self.layouts[0], self.tx, self.cfg.seq_len)
        init = jax.jit(
            lambda key: nn.unbox(init_params(model, self.cfg.seq_len, key)),
            out_shardings=shardings["params"],
        )
        full = init(jax.random.key(seed))
        chunks = []
        for program in self.programs:
            params = jax.device_put(_slice_chunk(full, program.chunk), program.shardings["params"])
            opt_init = jax.jit(self.tx.init, out_shardings=program.shardings["opt_state"])
            chunks.append({"params": params, "opt_state": opt_init(params)})
        return {"step": 0, "chunks": chunks}

    def trace(self) -> float:
        """Tracing happens per program in :meth:`compile`; nothing to do separately."""
        return 0.0

    def compile(self) -> list[dict[str, Any]]:
        """Compile every chunk's programs; one compile event per stage (device group)."""
        seconds = [0.0] * self.cfg.pp
        kinds = {action.kind for group in self.schedule.groups for action in group}
        for program in self.programs:
            seconds[program.chunk.group] += program.compile(kinds, len(self.programs))
        self._grads = [p.compiled["zeros"]() for p in self.programs]
        # Made once, on the last group: built per step on the default device, the seed's copy
        # would queue behind group 0's work and stall the last stage's first backward.
        last = self.programs[-1].layout.replicated()
        self._loss_seed = jax.device_put(np.float32(1.0 / self.cfg.microbatches), last)
        # Jitted: evaluated eagerly, the schedule is a dozen small blocking dispatches per step.
        self._lr = jax.jit(self.schedule_fn)
        return [{"what": "stage", "stage": group, "seconds": s} for group, s in enumerate(seconds)]

    def _microbatches(self, batch: dict[str, np.ndarray]) -> list[dict[str, Any]]:
        first, last = self.programs[0], self.programs[-1]
        pieces = []
        for i in range(self.cfg.microbatches):
            rows = slice(i * first.rows, (i + 1) * first.rows)
            tokens, segments = batch["tokens"][rows], batch["segment_ids"][rows]
            pieces.append(
                {
                    "inputs": first.layout.shard_rows(np.ascontiguousarray(tokens[:, :-1])),
                    "targets": last.layout.shard_rows(np.ascontiguousarray(tokens[:, 1:])),
                    "segments": [layout.shard_rows(segments) for layout in self.layouts],
                }
            )
        return pieces

    def _run(self, action: Action, state: dict, data: list, buffers: _StepBuffers) -> Any:
        c, i = action.chunk, action.microbatch
        program = self.programs[c]
        compiled = program.compiled
        params = state["chunks"][c]["params"]
        key = (c, i)
        if action.kind == FORWARD:
            inputs = data[i]["inputs"] if program.chunk.first else buffers.inputs.pop(key)
            targets = data[i]["targets"] if program.chunk.last else None
            outputs, buffers.vjps[key] = compiled[FORWARD](
                params, inputs, data[i]["segments"][program.chunk.group], targets
            )
            if program.chunk.last:
                buffers.losses.append(outputs)
            else:
                buffers.inputs[(c + 1, i)] = transfer(
                    outputs, self.programs[c + 1].activation_sharding
                )
            return outputs
        dy = self._output_gradient(program, key, buffers)
        if action.kind == BACKWARD_WEIGHT:
            self._grads[c] = compiled[BACKWARD_WEIGHT](
                buffers.vjps.pop(key), buffers.weight_dy.pop(key), self._grads[c]
            )
            return self._grads[c]
        if action.kind == BACKWARD:
            self._grads[c], dx = compiled[BACKWARD](buffers.vjps.pop(key), dy, self._grads[c])
        else:
            buffers.weight_dy[key] = dy
            dx = None if program.chunk.first else compiled[BACKWARD_INPUT](buffers.vjps[key], dy)
        if dx is not None:
            buffers.grads_in[(c - 1, i)] = transfer(dx, self.programs[c - 1].activation_sharding)
        return (self._grads[c], dx) if action.kind == BACKWARD else dx

    def _output_gradient(self, program: ChunkPrograms, key, buffers: _StepBuffers) -> Any:
        if key in buffers.weight_dy:
            return buffers.weight_dy[key]
        if program.chunk.last:
            return self._loss_seed
        return buffers.grads_in.pop(key)

    def step(self, state: dict[str, Any], batch: dict[str, np.ndarray]):
        """One optimizer step: every action of the schedule, then the update of every chunk.

        Every ``timing_every``-th step blocks after each action to time it and queues a
        ``pipeline_timing`` event (per-action start and end, seconds from step start).

        Returns:
            (new state, metrics: loss, grad_norm, lr).
        """
        timed = self.next_step_blocks()
        self._steps_done += 1
        start = time.perf_counter()
        data = self._microbatches(batch)
        buffers = _StepBuffers()
        spans = []
        for action in self.order:
            begin = time.perf_counter()
            outputs = self._run(action, state, data, buffers)
            if timed:
                jax.block_until_ready(outputs)
                spans.append(
                    [
                        action.group,
                        action.chunk,
                        action.microbatch,
                        action.kind,
                        begin - start,
                        time.perf_counter() - start,
                    ]
                )
        new_state, grad_norm = self._update(state)
        self._fields = {"dispatch_s": time.perf_counter() - start}
        if timed:
            jax.block_until_ready(new_state)
            self._events.append(
                PipelineTiming(
                    step=state["step"] + 1,
                    actions=spans,
                    step_time_s=time.perf_counter() - start,
                )
            )
        loss = jnp.mean(jnp.stack(buffers.losses))
        lr = self._lr(np.int32(state["step"]))
        return new_state, {"loss": loss, "grad_norm": grad_norm, "lr": lr}

    def _update(self, state: dict[str, Any]) -> tuple[dict[str, Any], Any]:
        squared = [
            p.compiled["squared_norm"](g) for p, g in zip(self.programs, self._grads, strict=True)
        ]
        chunks, norm = [], None
        for c, program in enumerate(self.programs):
            norms = tuple(transfer(s, program.layout.replicated()) for s in squared)
            current = state["chunks"][c]
            params, opt_state, self._grads[c], chunk_norm = program.compiled["update"](
                current["params"], current["opt_state"], self._grads[c], norms
            )
            chunks.append({"params": params, "opt_state": opt_state})
            norm = chunk_norm if norm is None else norm
        return {"step": state["step"] + 1, "chunks": chunks}, norm

    def next_step_blocks(self) -> bool:
        """Whether the next :meth:`step` is a timed one, which blocks after every action."""
        return (self._steps_done + 1) % self.cfg.timing_every == 0

    def drain_events(self) -> list[Event]:
        events, self._events = self._events, []
        return events

    def step_fields(self) -> dict[str, Any]:
        """Host-side figures of the last step: ``dispatch_s`` (controller time to dispatch
        every action and update, seconds)."""
        return dict(self._fields)

    def checkpoint_items(self, state: dict[str, Any]) -> dict[str, Any]:
        return {f"chunk_{c}": chunk for c, chunk in enumerate(state["chunks"])}

    def abstract_items(self) -> dict[str, Any]:
        return {f"chunk_{p.chunk.index}": p.abstract for p in self.programs}

    def state_from_items(self, items: dict[str, Any], step: int) -> dict[str, Any]:
        return {"step": step, "chunks": [items[f"chunk_{c}"] for c in range(len(self.chunks))]}
