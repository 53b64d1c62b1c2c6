"""Conformance: every provider that can serve a case, checked against the native reference.

For each case of the grid (an op, a shape, a dtype) and each registered provider of the op, the
provider runs forward and backward (a VJP with a fixed random cotangent, gradients with respect to
every floating-point input) and is compared with ``native`` evaluated in float32 on the same
inputs (the low-precision inputs upcast, so input rounding is not counted as error). The float32
programs (the reference among them) are traced under ``jax.default_matmul_precision("float32")``,
so float32 cases test the algorithm rather than TF32 rounding on GPUs or bfloat16 passes on
TPUs; the bfloat16 ones under the default precision, as a run traces them (Mosaic compiles no
TPU kernel whose bfloat16 matmul asks for float32 precision).

Errors are normwise: ``max_abs = max |y - y_ref|`` and ``rel = max_abs / max |y_ref|`` (per output;
the backward reports the worst gradient). A case passes when ``rel`` is within the dtype's
tolerance for that direction (:data:`TOLERANCES`). Providers that cannot serve a case (another
backend, an unsupported shape or dtype) are listed as skipped with the reason. On accelerators
every provider that ran is also timed (forward + backward, median of :data:`TIMED_RUNS` runs)
relative to ``native`` in the same dtype; on CPU (Pallas interpreted) the time says nothing and is
not taken.

Most of the check's time is compilation, so each compiles as little as it can: inputs are made with
NumPy (no random-number kernel per shape), and each provider's VJP is one jitted function per op
and static arguments that takes every array as an argument, so XLA compiles it once per shape and
dtype: the float32 reference serves both dtypes of a case, and cases of the same shapes (the
attention cases that differ only in their segment ids) reuse each other's programs. Every program
of the grid is lowered first and compiled on a thread pool (a thread per usable CPU), while the
cases run in order as their programs become ready.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from titan.cpus import usable_cpus
from titan.errors import TitanError
from titan.ops import registry
from titan.shapes import RopeScaling

F32 = jnp.float32
TIMED_RUNS = 10


@dataclasses.dataclass(frozen=True)
class Tolerance:
    """Largest normwise relative error (see the module docstring) accepted per direction."""

    fwd: float
    bwd: float


# float32 (unit roundoff 2^-24 = 6e-8): providers differ from the reference only in summation
# order and exp vs exp2, a few units of roundoff times the reduction depth (<= 2^11 terms):
# 1e-5 forward; the backward chains two matmuls and sums dK/dV over query blocks: 5e-5.
# bfloat16 (8-bit significand, unit roundoff 2^-8 = 3.9e-3): one rounding of the output is
# already up to 0.4%; attention also rounds its probabilities to bf16 before the PV matmul
# (the FlashAttention convention, Dao 2023, Sec. 3.1.1) and the backward rounds P, dS and the
# cotangent: 2e-2 forward (5 units) and 4e-2 backward (10 units).
# The grid covers the compute dtypes titan trains in (``--compute-dtype``).
TOLERANCES = {
    "float32": Tolerance(fwd=1e-5, bwd=5e-5),
    "bfloat16": Tolerance(fwd=2e-2, bwd=4e-2),
}


@dataclasses.dataclass(frozen=True)
class Case:
    """One op call: ``build(rng)`` returns (args, kwargs) as NumPy arrays, floating-point ones in
    float32 (each dtype of the grid rounds them); ``diff`` are the positions of the
    floating-point args the backward differentiates."""

    op: str
    shape: str
    build: Callable[[np.random.Generator], tuple[tuple, dict]]
    diff: tuple[int, ...]


def _normal(rng: np.random.Generator, shape, std=1.0) -> np.ndarray:
    return rng.standard_normal(shape, dtype=np.float32) * np.float32(std)


def _segments(batch: int, seq_len: int, documents: int = 0) -> np.ndarray:
    """Packed documents: row b is cut at seq/3 and 3*seq/4 (row 0 holds one document); with
    ``documents``, every row is cut into that many documents of equal length."""
    pos = np.arange(seq_len)
    if documents:
        return np.broadcast_to(pos * documents // seq_len, (batch, seq_len)).astype(np.int32)
    cuts = (pos >= seq_len // 3).astype(np.int32) + (pos >= 3 * seq_len // 4)
    rows = [np.zeros(seq_len, np.int32)] + [cuts + 3 * b for b in range(1, batch)]
    return np.stack(rows).astype(np.int32)


def attention_case(b, s, h, k, d, *, segments=True, window=None, causal=True, documents=0) -> Case:
    """An attention call; ``documents``: rows of that many documents each (more than the
    cuDNN provider's packed bound at S 256, so that its dense path serves)."""

    def build(rng):
        q, *kv = (_normal(rng, (b, s, heads, d)) for heads in (h, k, k))
        kwargs = {
            "segment_ids": _segments(b, s, documents) if segments else None,
            "causal": causal,
            "sliding_window": window,
        }
        return (q, *kv), kwargs

    features = [f for f, on in (("causal", causal), ("segments", segments)) if on]
    features += [f"{documents} documents"] if documents else []
    features += [f"window {window}"] if window else []
    label = f"B{b} S{s} H{h} K{k} D{d} {'+'.join(features)}"
    return Case("attention", label, build, (0, 1, 2))


def rms_norm_case(b, s, e) -> Case:
    def build(rng):
        x = _normal(rng, (b, s, e))
        return (x, 1.0 + _normal(rng, (e,), 0.1)), {"eps": 1e-5}

    return Case("rms_norm", f"B{b} S{s} E{e}", build, (0, 1))


def rope_case(b, s, n, d, scaling: RopeScaling | None = None) -> Case:
    def build(rng):
        positions = np.broadcast_to(np.arange(s, dtype=np.int32), (b, s))
        return (_normal(rng, (b, s, n, d)), positions), {"theta": 10_000.0} | (
            {"scaling": scaling} if scaling else {}
        )

    label = " llama3-scaled" if scaling else ""
    return Case("rope", f"B{b} S{s} N{n} D{d}{label}", build, (0,))


def swiglu_case(b, s, e, f) -> Case:
    def build(rng):
        x = _normal(rng, (b, s, e))
        w_gate, w_up = (_normal(rng, (e, f), e**-0.5) for _ in range(2))
        return (x, w_gate, w_up, _normal(rng, (f, e), f**-0.5)), {}

    return Case("swiglu", f"B{b} S{s} E{e} F{f}", build, (0, 1, 2, 3))


def cross_entropy_case(b, s, e, v) -> Case:
    def build(rng):
        x = _normal(rng, (b, s, e))
        w_out = _normal(rng, (e, v), e**-0.5)
        return (x, w_out, rng.integers(0, v, (b, s), dtype=np.int32)), {}

    return Case("cross_entropy", f"B{b} S{s} E{e} V{v}", build, (0, 1))


def modulate_case(b, s, e) -> Case:
    def build(rng):
        x = _normal(rng, (b, s, e))
        shift, scale = (_normal(rng, (b, e), 0.1) for _ in range(2))
        return (x, shift, scale), {}

    return Case("modulate", f"B{b} S{s} E{e}", build, (0, 1, 2))


def patch_embed_case(b, side, c, p, e) -> Case:
    def build(rng):
        images = _normal(rng, (b, side, side, c))
        w = _normal(rng, (p, p, c, e), (p * p * c) ** -0.5)
        return (images, w, _normal(rng, (e,), 0.1)), {"patch": p}

    return Case("patch_embed", f"B{b} {side}x{side}x{c} P{p} E{e}", build, (0, 1, 2))


# Score-sized float32 arrays the native attention reference (titan.ops.native.attention) can
# hold at once in its VJP, counted from its code as an upper bound (XLA fuses some): the
# scores, the masked scores, the probabilities saved for the backward, their gradient, the
# scores' gradient and the softmax's reduction temporary. Half the device memory is left to
# the inputs and to the other programs of the check.
REFERENCE_SCORE_ARRAYS = 6
LARGE_ATTENTION_BATCH = 8  # the 0.9B benchmark model's batch (bench/mfu.py)


def attention_batch(heads: int, seq_len: int, usable_bytes: float | None) -> int:
    """The batch of a large attention case: :data:`LARGE_ATTENTION_BATCH`, halved until the
    float32 reference's score-sized arrays (:data:`REFERENCE_SCORE_ARRAYS` of ``batch x heads
    x seq_len^2`` float32) take at most half of ``usable_bytes`` (bytes per device; None:
    unknown, the full batch). A TPU v5e's 15.75 GiB takes B2 at 32 heads and B4 at 16, an
    H200's 139 GiB B8; at least 1."""
    batch = LARGE_ATTENTION_BATCH
    per_batch = REFERENCE_SCORE_ARRAYS * heads * seq_len**2 * 4
    while usable_bytes is not None and batch > 1 and batch * per_batch > usable_bytes / 2:
        batch //= 2
    return batch


def cases(backend: str, usable_bytes: float | None = None) -> list[Case]:
    """The grid: small shapes everywhere, on accelerators also the 0.9B benchmark model's (its
    attention at the batch :func:`attention_batch` fits in ``usable_bytes`` per device).

    The small attention cases span several blocks of the default flash tiles (S 256 over
    128/64-token blocks) so that block skipping (causal, window) runs; their head dim is the
    TPU's lane width (128), the smallest the splash kernels serve. Sequence 1100 exceeds the
    512-token chunk so that chunked cross-entropy pads and loops.
    """
    grid = [
        attention_case(2, 256, 2, 1, 128),
        attention_case(2, 256, 2, 1, 128, causal=False, window=40),
        attention_case(2, 256, 2, 1, 128, documents=12),
        rms_norm_case(2, 64, 128),
        rope_case(2, 64, 4, 16),
        # context 32 over D 16: one kept, one interpolated and six stretched frequencies
        rope_case(2, 64, 4, 16, RopeScaling(8.0, 1.0, 4.0, 32)),
        swiglu_case(2, 64, 128, 256),
        cross_entropy_case(2, 1100, 32, 256),
        modulate_case(2, 64, 128),
        patch_embed_case(2, 16, 4, 2, 64),
    ]
    if backend != "cpu":
        grid += [
            attention_case(attention_batch(16, 2048, usable_bytes), 2048, 16, 8, 128),
            # llama3-1b's heads
            attention_case(attention_batch(32, 2048, usable_bytes), 2048, 32, 8, 64),
            rms_norm_case(8, 2048, 2048),
            rope_case(8, 2048, 16, 128),
            swiglu_case(8, 2048, 2048, 5632),
            cross_entropy_case(8, 2048, 2048, 32_000),
            modulate_case(64, 256, 1024),
            patch_embed_case(64, 32, 4, 2, 1024),
        ]
    return grid


@dataclasses.dataclass
class Result:
    """One (case, provider, dtype) row. Errors are None when the provider did not run."""

    op: str
    provider: str
    dtype: str
    shape: str
    status: str
    fwd_abs: float | None = None
    fwd_rel: float | None = None
    bwd_abs: float | None = None
    bwd_rel: float | None = None
    time_ms: float | None = None
    time_vs_native: float | None = None

    @property
    def failed(self) -> bool:
        return self.status.startswith(("FAIL", "error"))

    @property
    def ran(self) -> bool:
        return not self.status.startswith("skipped")


@functools.cache
def _vjp_fn(impl: Callable[..., Any], diff: tuple[int, ...], static: tuple[tuple[str, Any], ...]):
    """jit(f) with f(args, arrays, cotangent) -> (out, grads): the VJP of ``impl`` with respect to
    the args at positions ``diff``, ``arrays`` the keyword arrays (segment ids) and ``static``
    the other keyword arguments. Every argument is traced, none baked in as a constant, so one
    function serves every dtype and every case of an op, and XLA compiles it once per shape and
    dtype: the float32 reference of a case is compiled once for both dtypes of the grid."""

    def run(args, arrays, cotangent):
        def forward(*inputs):
            full = list(args)
            for position, value in zip(diff, inputs, strict=True):
                full[position] = value
            return impl(*full, **arrays, **dict(static))

        out, vjp = jax.vjp(forward, *(args[i] for i in diff))
        return out, vjp(cotangent.astype(out.dtype))

    return jax.jit(run)


def _errors(got, want) -> tuple[float, float]:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    max_abs = float(np.max(np.abs(got - want)))
    return max_abs, max_abs / max(float(np.max(np.abs(want))), float(np.finfo(np.float32).tiny))


def _median_ms(fn, inputs) -> float:
    jax.block_until_ready(fn(*inputs))
    times = []
    for _ in range(TIMED_RUNS):
        start = time.perf_counter()
        jax.block_until_ready(fn(*inputs))
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def _available(chosen: registry.Provider, backend: str, args: tuple, kwargs: dict) -> Any:
    """The provider's answer for this call on ``backend`` (falsy, with a reason, if it cannot)."""
    if not registry.runs_on(chosen, backend):
        return registry.Unsupported(f"runs on {', '.join(chosen.backends or ())}")
    return chosen.serves(backend, *args, **kwargs)


class _Programs:
    """Compiles jitted functions on a thread pool (XLA compiles without holding the GIL, so the
    programs of the whole grid compile side by side), each once per function and argument
    shapes and dtypes; hands back futures of the executables. A function that fails to lower
    gives a future that raises its error."""

    def __init__(self, pool: concurrent.futures.Executor) -> None:
        self._pool = pool
        self._cache: dict[Any, concurrent.futures.Future] = {}

    def submit(self, fn, inputs: tuple) -> concurrent.futures.Future:
        leaves, tree = jax.tree.flatten(inputs)
        key = (fn, tree, tuple((leaf.shape, jnp.dtype(leaf.dtype)) for leaf in leaves))
        if key not in self._cache:
            try:
                lowered = fn.lower(*inputs)
            except Exception as err:  # noqa: BLE001 - reported on the provider's row
                failed: concurrent.futures.Future = concurrent.futures.Future()
                failed.set_exception(err)
                self._cache[key] = failed
            else:
                self._cache[key] = self._pool.submit(lowered.compile)
        return self._cache[key]


@dataclasses.dataclass
class _Prepared:
    """One case with its programs compiling: the NumPy inputs and, per row, the future of the
    program that computes it (None: skipped, or the float32 reference itself)."""

    case: Case
    built: tuple
    kwargs: dict
    cotangent: np.ndarray
    reference: concurrent.futures.Future
    rows: list[tuple[Result, concurrent.futures.Future | None]]


def _abstract(arrays: tuple, dtype: str) -> tuple:
    """Shapes and dtypes of ``arrays`` with the floating-point ones in ``dtype``."""
    return tuple(
        jax.ShapeDtypeStruct(a.shape, jnp.dtype(dtype) if _floating(a) else a.dtype) for a in arrays
    )


def _prepare(case: Case, names: Sequence[str], backend: str, programs: _Programs) -> _Prepared:
    """Make the inputs of ``case`` (NumPy, so no random-number kernel is compiled) and its
    cotangent, and submit the programs of every provider of ``names`` in each dtype of
    :data:`TOLERANCES`."""
    built, kwargs = case.build(np.random.default_rng(0))
    static = tuple((k, v) for k, v in kwargs.items() if not isinstance(v, np.ndarray))
    arrays = {
        k: jax.ShapeDtypeStruct(v.shape, v.dtype)
        for k, v in kwargs.items()
        if k not in dict(static)
    }
    native = registry.provider(case.op, registry.NATIVE)
    ref_fn = _vjp_fn(registry.load(native.impl), case.diff, static)
    out_shape = jax.eval_shape(lambda *a: native.run(*a, **kwargs), *built).shape
    cotangent = np.random.default_rng(1).standard_normal(out_shape, np.float32)
    cotangent_shape = jax.ShapeDtypeStruct(out_shape, np.float32)
    with jax.default_matmul_precision("float32"):
        reference = programs.submit(ref_fn, (_abstract(built, "float32"), arrays, cotangent_shape))
    rows: list[tuple[Result, concurrent.futures.Future | None]] = []
    for dtype in TOLERANCES:
        inputs = (_abstract(built, dtype), arrays, cotangent_shape)
        precision = "float32" if dtype == "float32" else None  # None: the default
        for name in names:
            row = Result(case.op, name, dtype, case.shape, "pass")
            chosen = registry.provider(case.op, name)
            answer = _available(chosen, backend, inputs[0], kwargs)
            if not answer:
                row.status = f"skipped: {getattr(answer, 'reason', 'cannot serve this case')}"
                rows.append((row, None))
            elif name == registry.NATIVE and dtype == "float32":
                rows.append((row, None))  # the reference itself
            else:
                fn = _vjp_fn(registry.load(chosen.impl), case.diff, static)
                with jax.default_matmul_precision(precision):
                    rows.append((row, programs.submit(fn, inputs)))
    return _Prepared(case, built, kwargs, cotangent, reference, rows)


def _run(prepared: _Prepared, backend: str) -> list[Result]:
    """Run the programs of a prepared case against its reference; on accelerators time them."""
    # device_put, not jnp.asarray: the latter compiles a copy per shape
    arrays = {k: jax.device_put(v) for k, v in prepared.kwargs.items() if isinstance(v, np.ndarray)}
    cotangent = jax.device_put(prepared.cotangent)
    reference = prepared.reference.result()
    for dtype in TOLERANCES:
        rounded = tuple(a.astype(jnp.dtype(dtype)) if _floating(a) else a for a in prepared.built)
        upcast = tuple(a.astype(np.float32) if _floating(a) else a for a in rounded)
        ref_inputs = (jax.device_put(upcast), arrays, cotangent)
        inputs = (jax.device_put(rounded), arrays, cotangent)
        ref = reference(*ref_inputs)
        rows = [(row, program) for row, program in prepared.rows if row.dtype == dtype]
        for row, program in rows:
            if not row.ran:
                continue
            if program is None:  # the reference itself
                executable, args, got = reference, ref_inputs, ref
            else:
                try:
                    executable, args = program.result(), inputs
                    got = executable(*inputs)
                except Exception as err:  # noqa: BLE001 - a provider crash is a reported failure
                    row.status = f"error: {type(err).__name__}: {str(err).splitlines()[0][:120]}"
                    continue
            _compare(row, got, ref)
            if backend != "cpu":
                row.time_ms = _median_ms(executable, args)
        native_ms = next((r.time_ms for r, _ in rows if r.provider == registry.NATIVE), None)
        for row, _ in rows:
            if row.time_ms and native_ms:
                row.time_vs_native = row.time_ms / native_ms
    return [row for row, _ in prepared.rows]


def _floating(array: np.ndarray) -> bool:
    """Whether a NumPy array holds floats (bfloat16 included, whose NumPy kind is not "f")."""
    return bool(jnp.issubdtype(array.dtype, jnp.floating))


def _compare(row: Result, got: tuple, ref: tuple) -> None:
    """Record the errors of ``got`` = (output, gradients) against ``ref`` and the status."""
    (out, grads), (ref_out, ref_grads) = got, ref
    row.fwd_abs, row.fwd_rel = _errors(out, ref_out)
    grad_errors = [_errors(g, r) for g, r in zip(grads, ref_grads, strict=True)]
    row.bwd_abs = max(e[0] for e in grad_errors)
    row.bwd_rel = max(e[1] for e in grad_errors)
    tolerance = TOLERANCES[row.dtype]
    if row.fwd_rel > tolerance.fwd or row.bwd_rel > tolerance.bwd:
        row.status = "FAIL"


def resolve(op: str | None, provider: str | None) -> list[str]:
    """The ops to check: ``op`` or all, those that ``provider`` (when given) implements.

    Raises:
        TitanError: an unknown op, or a provider not registered (for that op).
    """
    if op is not None and op not in registry.OPS:
        raise TitanError(f"--op must be one of {', '.join(registry.OPS)}, got {op!r}")
    ops = [op] if op else list(registry.OPS)
    if provider is not None:
        ops = [o for o in ops if provider in {p.name for p in registry.providers(o)}]
        if not ops:
            known = sorted(
                {p.name for o in ([op] if op else registry.OPS) for p in registry.providers(o)}
            )
            where = f" for op {op}" if op else ""
            raise TitanError(
                f"--provider {provider!r} is not registered{where}; known: {', '.join(known)}"
            )
    return ops


def run_checks(
    backend: str | None = None,
    op: str | None = None,
    provider: str | None = None,
    progress: Callable[[int, int, str], None] | None = None,
    usable_bytes: float | None = None,
) -> list[Result]:
    """Check providers against the native reference on the grid of :func:`cases`.

    Args:
        backend: ``jax.default_backend()`` by default.
        op, provider: restrict to one op and/or one provider (native still runs as the timing
            baseline on accelerators, and is listed).
        progress: called as ``progress(done, total, case)`` before each case (and once with
            ``done == total`` at the end).
        usable_bytes: the device memory the large attention cases are sized to
            (:func:`attention_batch`; None: unknown, their full batch).

    Raises:
        TitanError: an unknown op or provider (see :func:`resolve`).
    """
    ops = resolve(op, provider)
    backend = backend or jax.default_backend()
    results = []
    chosen = [case for case in cases(backend, usable_bytes) if case.op in ops]
    report = progress or (lambda done, total, case: None)
    with concurrent.futures.ThreadPoolExecutor(usable_cpus()) as pool:
        programs = _Programs(pool)
        prepared = []
        for case in chosen:
            names = [p.name for p in registry.providers(case.op)]
            if provider is not None:
                names = [n for n in names if n in (registry.NATIVE, provider)]
            prepared.append(_prepare(case, names, backend, programs))
        for done, case_ in enumerate(prepared):
            report(done, len(chosen), f"{case_.case.op} {case_.case.shape}")
            results.extend(_run(case_, backend))
    report(len(chosen), len(chosen), "")
    return results
