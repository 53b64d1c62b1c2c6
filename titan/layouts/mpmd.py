"""Single-controller MPMD pipeline: stages as separate jitted programs on their own devices.

The model is cut into chunks (:func:`titan.parallel.chunks.plan_chunks`); chunk c runs on stage
c % pp, a sub-mesh partitioned by Shardy with the same logical sharding rules as the SPMD
baseline. The model family is an adapter (:class:`titan.models.adapters.base.ModelAdapter`):
it gives each chunk's parameters and forward pass, and the shape of what crosses chunks. For
each chunk, compiled once per shape:

- ``forward(params, x, every, last) -> (outputs, vjp)``: the chunk's forward with ``jax.vjp``
  (``x``: the model input or the previous chunk's output; ``every``, ``last``: the microbatch's
  parts of :class:`titan.models.adapters.base.StageInputs`); the returned VJP object carries the
  residuals (saved activations) on the stage's devices until the backward consumes them. The
  last chunk outputs the microbatch's mean loss.
- ``backward(vjp, dy, grads) -> (grads + dW, dx)``: input and weight gradients, accumulated
  into float32 gradient buffers in the same program.
- ``backward_input(vjp, dy) -> dx`` and ``backward_weight(vjp, dy, grads) -> grads + dW`` for
  zero-bubble schedules: the same VJP with the unused half removed by XLA's dead-code
  elimination. Both walk the chain of activation gradients inside the chunk, so I + W cost more
  than B (the weight half re-derives the per-layer output gradients it needs).
- ``update(params, opt_state, grads, squared_norms, loss) -> (params, opt_state, zeroed grads,
  global_norm, finite)``: global-norm clipping with the norm over all chunks, then AdamW,
  applied only when the loss and the global norm are finite (every chunk's update takes all
  chunks' squared norms and the loss, so all decide alike before any applies its update).

One Python process (the controller) walks the schedule (:mod:`titan.schedules`) in a
dependency-respecting order and dispatches each action; JAX's asynchronous dispatch lets the
stages run concurrently. Activations and their gradients cross stages through :func:`transfer`.

Across processes (``jax.distributed``), every stage's devices belong to one process and each
process is the controller of its own stages: it walks the same schedule, compiles and runs only
its stages' programs, and takes part in every transfer that leaves or reaches them (JAX's
cross-host transfers: a process holding no shard of the value passes a handle,
:func:`titan.parallel.mesh.remote_array`). Every process walks the actions in the same order,
so the transfers pair up. The arrays of another process's stages are such handles: the state of
a chunk lives, and is checkpointed, on its own process (:mod:`titan.checkpoint.stage_store`).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypedDict

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding, PartitionSpec

from titan.errors import TitanError
from titan.layouts.contract import Batch, ChunkState, StepMetrics, TrainState
from titan.layouts.description import LayoutDescription
from titan.models.adapters.base import ModelAdapter
from titan.optimizer import (
    applied_learning_rate,
    clip_by_global_norm,
    finite_step,
    keep_if_not_finite,
)
from titan.parallel.chunks import (
    Chunk,
    chunk_item,
    chunk_ranges,
    cut_layers,
    join_layers,
    whole_model,
)
from titan.parallel.fit import microbatch_rows
from titan.parallel.mesh import DeviceMesh, remote_array
from titan.parallel.sharding import BATCH_AXES
from titan.schedules import (
    BACKWARD,
    BACKWARD_INPUT,
    BACKWARD_WEIGHT,
    FORWARD,
    Action,
    Schedule,
    execution_order,
    theoretical_bubble,
)
from titan.telemetry.device_memory import largest, program_memory
from titan.telemetry.events import Compile, Event, Pipeline, PipelineTiming


def transfer(x: Any, sharding: NamedSharding) -> Any:
    """Move an activation (or its gradient, or a scalar) onto the receiving stage's devices.

    The one place where data crosses stages. ``jax.device_put`` returns at once and
    copies device to device when ``x`` is ready (NVLink/PCIe between GPUs of one host). When the
    stages belong to different processes it is a cross-host transfer, which both processes
    call (the one without ``x``'s shards passes a :func:`titan.parallel.mesh.remote_array`); a
    process owning neither stage gets a handle back at no cost. Source and destination have the
    same number of devices (every stage has the same mesh shape), as cross-host copies require.
    """
    return jax.device_put(x, sharding)


LOSS_DTYPE = jnp.float32  # the adapters' scalar loss (ModelAdapter.forward)


def _scalar(mesh: DeviceMesh) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct((), LOSS_DTYPE, sharding=mesh.replicated())


def _local(x: jax.Array) -> jax.Array:
    """This process's copy of a replicated value (readable with ``jax.device_get`` even when
    the array spans several processes)."""
    return x.addressable_data(0)


def _squared_norm(tree: Any) -> jax.Array:
    """The squared L2 norm of a stage's gradients, in float32 whatever their dtype (bf16
    gradients of ``--param-dtype bfloat16`` too: the update program takes float32 scalars)."""
    return jnp.square(optax.tree.norm(jax.tree.map(lambda g: g.astype(jnp.float32), tree)))


def _abstract(tree: Any, shardings: Any) -> Any:
    return jax.tree.map(
        lambda leaf, s: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=s), tree, shardings
    )


class UpdateFigures(TypedDict):
    """What a step's update returns on the device (the :class:`StepMetrics` fields other than
    the loss): global gradient norm, finite flag, learning rate applied."""

    grad_norm: jax.Array
    finite: jax.Array
    lr: jax.Array


@dataclass
class ChunkPrograms:
    """The compiled programs of one model chunk on its stage's devices."""

    chunk: Chunk
    mesh: DeviceMesh
    adapter: ModelAdapter
    tx: optax.GradientTransformation
    lr_schedule: optax.Schedule
    dtype: jnp.dtype
    grad_clip: float
    shardings: Any
    abstract: ChunkState
    rows: int
    compiled: dict[str, Any] = field(default_factory=dict)
    _eval: Any = None

    @property
    def activation_sharding(self) -> NamedSharding:
        shape, _ = self.adapter.activation(self.rows, self.dtype)
        spec = PartitionSpec(BATCH_AXES, *([None] * (len(shape) - 1)))
        return NamedSharding(self.mesh.jax_mesh, spec)

    def _apply(self, params, x, every, last):
        return self.adapter.forward(self.chunk, params, x, every, last, self.dtype)

    def eval_forward(self, params, x, every, last):
        """The chunk's forward alone, no VJP (evaluation): its output, the mean loss on the
        last chunk. Jitted on first call (under the stage mesh's tracing context)."""
        if self._eval is None:
            self._eval = jax.jit(self._apply)
        with self.mesh.tracing():
            return self._eval(params, x, every, last)

    def _forward(self, params, x, every, last):
        if self.chunk.first:
            return jax.vjp(lambda p: self._apply(p, x, every, last), params)
        return jax.vjp(lambda p, h: self._apply(p, h, every, last), params, x)

    def _backward(self, vjp, dy, grads):
        cotangents = vjp(dy)
        grads = jax.tree.map(jnp.add, grads, cotangents[0])
        return grads, (None if self.chunk.first else cotangents[1])

    def _backward_input(self, vjp, dy):
        return vjp(dy)[1]

    def _backward_weight(self, vjp, dy, grads):
        return jax.tree.map(jnp.add, grads, vjp(dy)[0])

    def _update(self, params, opt_state, grads, squared_norms, loss):
        global_norm = jnp.sqrt(sum(squared_norms))
        finite = finite_step(loss, global_norm)
        lr = applied_learning_rate(self.lr_schedule, opt_state)
        grads = clip_by_global_norm(grads, global_norm, self.grad_clip)
        updates, new_opt_state = self.tx.update(grads, opt_state, params)
        updated = (optax.apply_updates(params, updates), new_opt_state)
        params, opt_state = keep_if_not_finite(finite, updated, (params, opt_state))
        zeros = jax.tree.map(jnp.zeros_like, grads)
        return params, opt_state, zeros, global_norm, finite, lr

    def activation_abstract(self) -> jax.ShapeDtypeStruct:
        """The chunk's output (and the next chunk's input) of one microbatch."""
        shape, dtype = self.adapter.activation(self.rows, self.dtype)
        return jax.ShapeDtypeStruct(shape, dtype, sharding=self.activation_sharding)

    def _abstract_inputs(self) -> tuple[Any, Any, Any]:
        """Abstract (x, every, last) of one microbatch, from the adapter's batch shapes."""
        sharding = self.mesh.batch_sharding(self.rows)
        batch = {
            key: jax.ShapeDtypeStruct(value.shape, value.dtype, sharding=sharding)
            for key, value in self.adapter.batch_shapes(self.rows).items()
        }
        parts = jax.eval_shape(self.adapter.stage_inputs, batch)
        place = functools.partial(_with_sharding, sharding)
        x = place(parts.first) if self.chunk.first else self.activation_abstract()
        last = jax.tree.map(place, parts.last) if self.chunk.last else {}
        return x, jax.tree.map(place, parts.every), last

    def _output_gradient_abstract(self) -> jax.ShapeDtypeStruct:
        if self.chunk.last:
            return jax.ShapeDtypeStruct((), jnp.float32, sharding=self.mesh.replicated())
        return self.activation_abstract()

    def _zeros(self) -> Any:
        return jax.tree.map(lambda p: jnp.zeros(p.shape, p.dtype), self.abstract["params"])

    def compile(self, kinds: set[str], chunks: int) -> float:
        """Compile, ahead of time, the forward, the backward ``kinds`` the schedule uses, the
        gradient-buffer programs and the update (which takes the squared gradient norms of all
        ``chunks``). Returns seconds (trace + XLA compile)."""
        start = time.perf_counter()
        params, opt_state = self.abstract["params"], self.abstract["opt_state"]
        grad_shardings, replicated = self.shardings["params"], self.mesh.replicated()
        grads = _abstract(params, grad_shardings)
        x, every, last = self._abstract_inputs()
        with self.mesh.tracing():
            forward = jax.jit(self._forward).lower(params, x, every, last).compile()
        vjp, dy = forward.out_info[1], self._output_gradient_abstract()
        dx = None if self.chunk.first else self.activation_sharding
        scalar = jax.ShapeDtypeStruct((), jnp.float32, sharding=replicated)
        update_out = (
            grad_shardings,
            self.shardings["opt_state"],
            grad_shardings,
            replicated,
            replicated,
            replicated,
        )
        # name: (function, out_shardings, donate_argnums, example arguments)
        programs: dict[str, tuple[Callable[..., Any], Any, int | tuple[int, ...], tuple]] = {
            BACKWARD: (self._backward, (grad_shardings, dx), 2, (vjp, dy, grads)),
            BACKWARD_INPUT: (self._backward_input, dx, (), (vjp, dy)),
            BACKWARD_WEIGHT: (self._backward_weight, grad_shardings, 2, (vjp, dy, grads)),
            "zeros": (self._zeros, grad_shardings, (), ()),
            "squared_norm": (_squared_norm, replicated, (), (grads,)),
            "update": (
                self._update,
                update_out,
                (0, 1, 2),
                (params, opt_state, grads, (scalar,) * chunks, scalar),
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


def _with_sharding(sharding: NamedSharding, leaf: Any) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sharding)


def _check_whole_stages(meshes: list[DeviceMesh]) -> None:
    """Across processes each stage must belong to one process (its controller).

    Raises:
        TitanError: a stage's devices span processes.
    """
    split = next((s for s, mesh in enumerate(meshes) if len(mesh.processes) > 1), None)
    if split is None:
        return
    per_process = len(jax.local_devices())
    raise TitanError(
        f"--layout mpmd across processes needs each stage's devices on one process: stage "
        f"{split} has {meshes[split].device_count} devices over processes "
        f"{sorted(meshes[split].processes)} ({per_process} devices per process; give a stage "
        "dp x fsdp x tp that divides the devices of a process)"
    )


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
    """MPMD layout: per-chunk programs, a schedule, and the controller that executes it (a
    :class:`titan.layouts.contract.Trainer`).

    The state's chunk c lives on stage c % pp. Gradient buffers live on the trainer between
    steps.

    Attributes:
        adapter: the model family.
        meshes: one device mesh per stage.
        chunks: the model chunks, in model order.
        programs: one :class:`ChunkPrograms` per chunk.
        tx: the optimizer (its learning rate per step is each :class:`ChunkPrograms`'s
            ``lr_schedule``).
        compute_dtype: dtype of forward and backward.
        schedule: the pipeline schedule (:mod:`titan.schedules`).
        order: the schedule's actions in dispatch order.
        timing_every: every N-th step is timed per action (``pipeline_timing`` events).
    """

    adapter: ModelAdapter
    meshes: list[DeviceMesh]
    chunks: list[Chunk]
    programs: list[ChunkPrograms]
    tx: optax.GradientTransformation
    compute_dtype: jnp.dtype
    schedule: Schedule
    order: list[Action]
    timing_every: int
    _grads: list[Any] = field(default_factory=list)
    _loss_seed: Any = None
    _events: list = field(default_factory=list)
    _fields: dict[str, Any] = field(default_factory=dict)
    _steps_done: int = 0

    @classmethod
    def build(
        cls,
        adapter: ModelAdapter,
        meshes: list[DeviceMesh],
        chunks: list[Chunk],
        schedule: Schedule,
        optimizer: tuple[optax.GradientTransformation, optax.Schedule],
        dtype: jnp.dtype,
        batch_size: int,
        grad_clip: float,
        timing_every: int,
    ) -> PipelineTrainer:
        """Validate the layout and build the programs (not compiled yet).

        Raises:
            TitanError: microbatch rows that do not split over a stage's data x fsdp axes, a
                parameter dimension that does not divide its mesh axis, (across processes)
                a stage whose devices belong to several processes, or a model whose loss has
                terms (:meth:`~titan.models.adapters.base.ModelAdapter.loss_terms`).
        """
        _check_whole_stages(meshes)
        if adapter.loss_terms():
            raise TitanError(
                f"--layout mpmd: the loss has terms that the pipeline does not carry "
                f"({', '.join(adapter.loss_terms())}): use --layout spmd"
            )
        m = schedule.microbatches
        rows = microbatch_rows(batch_size, m, meshes[0].mesh_shape)  # a stage's dp x fsdp
        tx, lr_schedule = optimizer
        programs = []
        for chunk in chunks:
            mesh = meshes[chunk.stage]
            shardings, abstract = mesh.state_shardings(tx, *adapter.abstract_params(chunk))
            programs.append(
                ChunkPrograms(
                    chunk,
                    mesh,
                    adapter,
                    tx,
                    lr_schedule,
                    dtype,
                    grad_clip,
                    shardings,
                    abstract,
                    rows,
                )
            )
        order = execution_order(schedule)
        return cls(
            adapter,
            meshes,
            chunks,
            programs,
            tx,
            dtype,
            schedule,
            order,
            timing_every,
        )

    @property
    def pp(self) -> int:
        return self.schedule.pp

    def describe(self) -> LayoutDescription:
        """The layout as recorded in ``run_start`` and in checkpoints."""
        s = self.schedule
        return LayoutDescription(
            "mpmd",
            self.meshes[0].mesh_shape,
            sum(mesh.device_count for mesh in self.meshes),
            chunk_ranges(self.chunks),
            microbatches=s.microbatches,
            pp=s.pp,
            virtual_stages=s.virtual_stages,
            schedule=s.name,
        )

    def start_events(self) -> list[Event]:
        """The ``pipeline`` event: stages, devices and layers per stage, schedule, bubble."""
        s = self.schedule
        return [
            Pipeline(
                stages=s.pp,
                virtual_stages=s.virtual_stages,
                devices_per_stage=self.meshes[0].device_count,
                layers_per_chunk=[c.n_layers for c in self.chunks],
                chunk_stage=[c.stage for c in self.chunks],
                schedule=s.name,
                microbatches=s.microbatches,
                theoretical_bubble=theoretical_bubble(
                    s.name, s.pp, s.microbatches, s.virtual_stages
                ),
                actions=[[str(a) for a in stage] for stage in s.stages],
            )
        ]

    def init_state(self, seed: int) -> TrainState:
        """Initialise the whole model on stage 0 (the same values as the SPMD layout for the
        same seed), then move each chunk's slice to its stage. Stage 0 must hold the whole
        model's parameters once. Across processes each process initialises the whole model on
        its own first stage and keeps its own chunks (the others' are handles)."""
        whole = whole_model(self.adapter.n_layers)
        shapes, logical = self.adapter.abstract_params(whole)
        home = next(mesh for mesh in self.meshes if mesh.is_local)
        init = jax.jit(
            self.adapter.init_params, out_shardings=home.param_shardings(shapes, logical)
        )
        joined = join_layers(
            [init(jax.random.key(seed))], self.adapter.is_layer_stacked, self.adapter.layer_axis
        )
        chunks = []
        for program in self.programs:
            if not program.mesh.is_local:
                chunks.append(jax.tree.map(remote_array, program.abstract))
                continue
            params = cut_layers(
                joined,
                program.abstract["params"],
                program.chunk,
                self.adapter.is_layer_stacked,
                self.adapter.layer_axis,
            )
            opt_init = jax.jit(self.tx.init, out_shardings=program.shardings["opt_state"])
            chunks.append({"params": params, "opt_state": opt_init(params)})
        return TrainState(0, tuple(chunks))

    def trace(self) -> float:
        """Tracing happens per program in :meth:`compile`; nothing to do separately."""
        return 0.0

    def compile(self) -> list[Compile]:
        """Compile every chunk's programs; one compile event per stage."""
        seconds: dict[int, float] = {}
        kinds = {action.kind for stage in self.schedule.stages for action in stage}
        for program in self.programs:
            if program.mesh.is_local:
                stage = program.chunk.stage
                seconds[stage] = seconds.get(stage, 0.0) + program.compile(
                    kinds, len(self.programs)
                )
        self._grads = [p.compiled["zeros"]() if p.mesh.is_local else None for p in self.programs]
        # Made once, on the last stage: built per step on the default device, the seed's copy
        # would queue behind stage 0's work and stall the last stage's first backward.
        last = self.programs[-1].mesh.replicated()
        self._loss_seed = jax.device_put(np.float32(1.0 / self.schedule.microbatches), last)
        return [
            Compile(what="stage", stage=stage, seconds=s, memory=self._stage_memory(stage))
            for stage, s in seconds.items()
        ]

    def _stage_memory(self, stage: int) -> dict[str, int] | None:
        """The largest memory-analysis figures over the compiled programs of ``stage``."""
        compiled = [c for p in self.programs if p.chunk.stage == stage for c in p.compiled.values()]
        return largest(program_memory(c) for c in compiled)

    def _microbatches(self, batch: Batch) -> list[dict[str, Any]]:
        """Per microbatch: the first chunk's input on stage 0, the loss's inputs on the last
        stage, and the arrays every chunk takes on every stage (those of this process's stages:
        every process reads the whole global batch, :meth:`process_rows`)."""
        first, last = self.programs[0], self.programs[-1]
        parts = self.adapter.stage_inputs(batch)
        pieces = []
        for i in range(self.schedule.microbatches):
            rows = slice(i * first.rows, (i + 1) * first.rows)

            def on(mesh: DeviceMesh, values: dict, rows: slice = rows) -> dict[str, jax.Array]:
                if not mesh.is_local:  # another process's stage: it places its own rows
                    return {}
                return {
                    k: mesh.shard_rows(np.ascontiguousarray(v[rows])) for k, v in values.items()
                }

            pieces.append(
                {
                    "x": on(first.mesh, {"x": parts.first}).get("x"),
                    "last": on(last.mesh, parts.last),
                    "every": [on(mesh, parts.every) for mesh in self.meshes],
                }
            )
        return pieces

    def _run(self, action: Action, state: TrainState, data: list, buffers: _StepBuffers) -> Any:
        c, i = action.chunk, action.microbatch
        program = self.programs[c]
        if not program.mesh.is_local:
            return self._pass_on(action, buffers)
        compiled = program.compiled
        params = state.chunks[c]["params"]
        key = (c, i)
        if action.kind == FORWARD:
            x = data[i]["x"] if program.chunk.first else buffers.inputs.pop(key)
            last = data[i]["last"] if program.chunk.last else {}
            outputs, buffers.vjps[key] = compiled[FORWARD](
                params, x, data[i]["every"][program.chunk.stage], last
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

    def _pass_on(self, action: Action, buffers: _StepBuffers) -> None:
        """Another process's action: take part in the transfer it ends with (the activation to
        the next chunk, or the input gradient to the previous one)."""
        c, i = action.chunk, action.microbatch
        program = self.programs[c]
        if action.kind == FORWARD and not program.chunk.last:
            sent = remote_array(program.activation_abstract())
            buffers.inputs[(c + 1, i)] = transfer(sent, self.programs[c + 1].activation_sharding)
        elif action.kind in (BACKWARD, BACKWARD_INPUT) and not program.chunk.first:
            sent = remote_array(program.activation_abstract())
            buffers.grads_in[(c - 1, i)] = transfer(sent, self.programs[c - 1].activation_sharding)

    def _output_gradient(self, program: ChunkPrograms, key, buffers: _StepBuffers) -> Any:
        if key in buffers.weight_dy:
            return buffers.weight_dy[key]
        if program.chunk.last:
            return self._loss_seed
        return buffers.grads_in.pop(key)

    def step(self, state: TrainState, batch: Batch) -> tuple[TrainState, StepMetrics]:
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
            if timed and self.meshes[action.stage].is_local:
                jax.block_until_ready(outputs)
                spans.append(
                    [
                        action.stage,
                        action.chunk,
                        action.microbatch,
                        action.kind,
                        begin - start,
                        time.perf_counter() - start,
                    ]
                )
        losses = self._loss_on_stages(buffers)
        new_state, figures = self._update(state, losses)
        self._fields = {"dispatch_s": time.perf_counter() - start}
        if timed:
            jax.block_until_ready(new_state)
            self._events.append(
                PipelineTiming(
                    step=state.step + 1,
                    actions=spans,
                    step_time_s=time.perf_counter() - start,
                )
            )
        loss = self._local_loss(losses)
        return new_state, {"loss": loss, **figures}

    def _local_loss(self, losses: list[jax.Array]) -> jax.Array:
        """This process's copy of the loss of :meth:`_loss_on_stages`."""
        return _local(next(x for x, m in zip(losses, self.meshes, strict=True) if m.is_local))

    def eval_loss(self, state: TrainState, batch: Batch) -> jax.Array:
        """The mean loss of ``batch``, forward passes only (evaluation): each microbatch goes
        through the chunks in model order, each chunk's forward on its own stage
        (:meth:`ChunkPrograms.eval_forward`), activations crossing stages by :func:`transfer`
        (across processes every process takes part in each transfer, as in a step); no
        schedule, no residuals kept. Returns this process's copy of the float32 scalar."""
        buffers = _StepBuffers()
        for piece in self._microbatches(batch):
            x = piece["x"]
            for program in self.programs:
                x = self._eval_chunk(program, state, piece, x, buffers)
        return self._local_loss(self._loss_on_stages(buffers))

    def _eval_chunk(
        self, program: ChunkPrograms, state: TrainState, piece: dict, x: Any, buffers: _StepBuffers
    ) -> Any:
        """One chunk's forward of one microbatch: the next chunk's input (None after the last
        chunk, whose loss goes to ``buffers.losses``)."""
        chunk = program.chunk
        if not program.mesh.is_local:  # another process's chunk: take part in its transfer
            out = None if chunk.last else remote_array(program.activation_abstract())
        else:
            last = piece["last"] if chunk.last else {}
            every = piece["every"][chunk.stage]
            out = program.eval_forward(state.chunks[chunk.index]["params"], x, every, last)
            if chunk.last:
                buffers.losses.append(out)
        if chunk.last:
            return None
        return transfer(out, self.programs[chunk.index + 1].activation_sharding)

    def _loss_on_stages(self, buffers: _StepBuffers) -> list[jax.Array]:
        """The step's mean loss, computed on the last stage, on every stage's devices (the
        updates decide on it whether the step is finite; it is read where the record is
        written). Across processes every process takes part in each transfer."""
        last = self.programs[-1].mesh
        loss = jnp.mean(jnp.stack(buffers.losses)) if last.is_local else remote_array(_scalar(last))
        return [transfer(loss, mesh.replicated()) for mesh in self.meshes]

    def _update(
        self, state: TrainState, losses: list[jax.Array]
    ) -> tuple[TrainState, UpdateFigures]:
        """Every chunk's update, each given the squared gradient norms of all chunks and the
        loss on its stage (``losses``), so that each decides alike, on its own devices, whether
        the step is finite (:func:`titan.optimizer.finite_step`) before applying it. Across
        processes only this process's chunks are updated, and every process takes part in
        sending each chunk's squared norm to every stage. Returns the new state and the
        update's figures, as this process's copies."""
        squared = [
            p.compiled["squared_norm"](g) if p.mesh.is_local else remote_array(_scalar(p.mesh))
            for p, g in zip(self.programs, self._grads, strict=True)
        ]
        on_stage = [tuple(transfer(s, mesh.replicated()) for s in squared) for mesh in self.meshes]
        chunks, figures = [], None
        for c, program in enumerate(self.programs):
            current, stage = state.chunks[c], program.chunk.stage
            if not program.mesh.is_local:
                chunks.append(current)
                continue
            params, opt_state, self._grads[c], *scalars = program.compiled["update"](
                current["params"],
                current["opt_state"],
                self._grads[c],
                on_stage[stage],
                losses[stage],
            )
            chunks.append({"params": params, "opt_state": opt_state})
            if figures is None:
                norm, finite, lr = (_local(x) for x in scalars)
                figures = UpdateFigures(grad_norm=norm, finite=finite, lr=lr)
        assert figures is not None  # every process holds a chunk
        return TrainState(state.step + 1, tuple(chunks)), figures

    def next_step_blocks(self) -> bool:
        """Whether the next :meth:`step` is a timed one, which blocks after every action."""
        return (self._steps_done + 1) % self.timing_every == 0

    def drain_events(self) -> list[Event]:
        events, self._events = self._events, []
        return events

    def step_fields(self) -> dict[str, Any]:
        """Host-side figures of the last step: ``dispatch_s`` (controller time to dispatch
        every action and update, seconds)."""
        return dict(self._fields)

    def process_rows(self, batch_size: int) -> None:
        """Every process reads the whole global batch: its stages take every microbatch."""
        return None

    def abstract_items(
        self, chunks: list[Chunk] | None = None, mesh: DeviceMesh | None = None
    ) -> dict[str, ChunkState]:
        if chunks is None and mesh is None:
            return {chunk_item(p.chunk.index): p.abstract for p in self.programs}
        items = {}
        for chunk in chunks or self.chunks:
            target = mesh or self.meshes[chunk.stage]
            shapes, logical = self.adapter.abstract_params(chunk)
            items[chunk_item(chunk.index)] = target.state_shardings(self.tx, shapes, logical)[1]
        return items
