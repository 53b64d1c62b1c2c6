"""Op providers: registry choices, conformance of every provider on CPU (Pallas interpreted),
``titan ops check``, and the MFU benchmark's smoke run."""

from __future__ import annotations

import concurrent.futures
import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from bench_modules import bench_module
from jax.sharding import PartitionSpec as P

from titan.cli import main
from titan.errors import TitanError
from titan.ops import Ops, conformance, native, registry
from titan.ops.providers import (
    chunked,
    cudnn,
    flash_attention,
    fused_loss,
    fused_rope,
    platform,
    splash_attention,
    swiglu,
)

REPO = Path(__file__).resolve().parents[2]
OPT_IN = {
    "attention": "pallas",
    "rms_norm": "pallas",
    "cross_entropy": "chunked",
    "swiglu": "pallas",
}


def _run(*argv: str) -> subprocess.CompletedProcess:
    """A Python process from the repo root (the tests' ``XLA_FLAGS``), no ``TITAN_OPS``; must
    exit 0."""
    env = {k: v for k, v in os.environ.items() if k != "TITAN_OPS"}
    done = subprocess.run(
        [sys.executable, *argv], env=env, capture_output=True, text=True, timeout=300, cwd=REPO
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done


def _shapes(dtype=jnp.float32, head_dim=16, seq=64, dim=64, ffn=128):
    s = jax.ShapeDtypeStruct
    return {
        "q": s((2, seq, 4, head_dim), dtype),
        "kv": s((2, seq, 2, head_dim), dtype),
        "segments": s((2, seq), jnp.int32),
        "x": s((2, seq, dim), dtype),
        "scale": s((dim,), dtype),
        "w_out": s((dim, 128), dtype),
        "w_in": s((dim, ffn), dtype),
        "w_back": s((ffn, dim), dtype),
    }


def _trace_every_op(ops: Ops, **shape_args) -> dict[str, str]:
    """Trace (no compile) one call of each op; returns who served what."""
    a = _shapes(**shape_args)

    def model(q, kv, segments, x, scale, w_out, w_in, w_back):
        attended = ops.attention(ops.rope(q, segments, theta=1e4), kv, kv, segment_ids=segments)
        hidden = ops.swiglu(ops.rms_norm(x, scale, eps=1e-5), w_in, w_in, w_back)
        return attended, ops.cross_entropy(hidden, w_out, segments)

    jax.eval_shape(model, *a.values())
    return ops.served


def test_importing_ops_and_their_command_imports_no_jax():
    code = "import sys, titan.ops, titan.commands.ops; print('jax' in sys.modules)"
    assert _run("-c", code).stdout.strip() == "False"


def test_cpu_serves_native_unless_forced_and_records_the_provider(monkeypatch):
    monkeypatch.delenv("TITAN_OPS", raising=False)
    served = _trace_every_op(Ops("cpu"))
    assert served.pop("cross_entropy") == served.pop("rope") == "fused"  # every backend's first
    assert set(served.values()) == {"native"}
    forced = _trace_every_op(Ops("cpu", OPT_IN))
    assert forced == {**OPT_IN, "rope": "fused"}
    monkeypatch.setenv("TITAN_OPS", "attention=pallas")
    env_forced = Ops("cpu")
    assert _trace_every_op(env_forced)["attention"] == "pallas"
    assert _trace_every_op(env_forced.unforced())["attention"] == "native"


def test_a_forced_provider_that_cannot_serve_is_a_one_line_error(monkeypatch):
    monkeypatch.delenv("TITAN_OPS", raising=False)
    with pytest.raises(
        TitanError, match="unknown provider 'cudnn' for op attention on backend cpu"
    ):
        Ops("cpu", {"attention": "cudnn"})
    with pytest.raises(TitanError, match="head dim 24 must be a power of two"):
        _trace_every_op(Ops("cpu", {"attention": "pallas"}), head_dim=24)
    with pytest.raises(TitanError, match="model dim 96 must be a power of two"):
        _trace_every_op(Ops("cpu", {"rms_norm": "pallas"}), dim=96)
    with pytest.raises(TitanError, match="ffn dim 96 must be a multiple of 128"):
        _trace_every_op(Ops("cpu", {"swiglu": "pallas"}), ffn=96)
    with pytest.raises(TitanError, match="rope needs an even head dim, got 3"):
        Ops("cpu").rope(jnp.ones((1, 2, 1, 3)), jnp.zeros((1, 2), jnp.int32), theta=1e4)
    with pytest.raises(TitanError, match="--ops entry 'attention' must look like op=provider"):
        registry.parse_overrides("attention", source="--ops")
    with pytest.raises(TitanError, match="--ops names op 'rope' twice"):
        registry.parse_overrides("rope=fused, rope=native", source="--ops")


@pytest.mark.parametrize(
    ("vendor", "capability", "case", "expected"),
    [
        ("cuda", (9, 0), {"dtype": jnp.bfloat16, "head_dim": 128}, "cudnn"),  # packed
        ("cuda", (9, 0), {"dtype": jnp.bfloat16, "head_dim": 128, "jax": (0, 10, 2)}, "pallas"),
        ("cuda", (9, 0), {"dtype": jnp.bfloat16, "head_dim": 128, "segments": False}, "cudnn"),
        ("cuda", (9, 0), {"dtype": jnp.bfloat16, "head_dim": 64}, "cudnn"),
        ("cuda", (9, 0), {"dtype": jnp.bfloat16, "head_dim": 128, "seq": 255}, "native"),
        ("cuda", (9, 0), {"dtype": jnp.float32, "head_dim": 128}, "native"),
        ("cuda", (8, 0), {"dtype": jnp.bfloat16, "head_dim": 128}, "cudnn"),
        ("cuda", (8, 0), {"dtype": jnp.bfloat16, "head_dim": 256}, "native"),
        ("rocm", (0, 0), {"dtype": jnp.bfloat16, "head_dim": 128}, "native"),
    ],
)
def test_gpu_attention_choice_follows_capabilities(monkeypatch, vendor, capability, case, expected):
    monkeypatch.setattr(platform, "_gpu_vendor", lambda: vendor)
    monkeypatch.setattr(cudnn, "cuda_capability", lambda: capability)
    monkeypatch.setattr(cudnn, "_jax_version", lambda: case.get("jax", (0, 11, 2)))
    monkeypatch.setattr(flash_attention, "cuda_capability", lambda: capability)
    seq = case.get("seq", 2048)
    a = _shapes(case["dtype"], case["head_dim"], seq=seq)
    segments = a["segments"] if case.get("segments", True) else None
    table = registry.OpTable("gpu", from_env=False)
    chosen = table.choose("attention", a["q"], a["kv"], a["kv"], segment_ids=segments)
    assert chosen.name == expected


def test_rocm_runs_pallas_when_asked_and_refuses_cudnn(monkeypatch):
    monkeypatch.setattr(platform, "_gpu_vendor", lambda: "rocm")
    a = _shapes(jnp.bfloat16, 128)
    args = (a["q"], a["kv"], a["kv"])
    pallas = registry.OpTable("gpu", {"attention": "pallas"}, from_env=False)
    assert pallas.choose("attention", *args, segment_ids=a["segments"]).name == "pallas"
    with pytest.raises(TitanError, match="needs a CUDA GPU"):
        registry.OpTable("gpu", {"attention": "cudnn"}, from_env=False).choose("attention", *args)


@pytest.mark.parametrize(
    ("backend", "devices", "case", "expected"),
    [
        ("tpu", 1, {"dtype": jnp.bfloat16, "head_dim": 128}, "splash"),
        ("tpu", 1, {"dtype": jnp.bfloat16, "head_dim": 128, "segments": False}, "splash"),
        ("tpu", 1, {"dtype": jnp.float32, "head_dim": 128}, "native"),  # bf16 only on a TPU
        ("tpu", 1, {"dtype": jnp.bfloat16, "head_dim": 64}, "native"),
        ("tpu", 1, {"dtype": jnp.bfloat16, "head_dim": 128, "seq": 2000}, "native"),
        ("tpu", 8, {"dtype": jnp.bfloat16, "head_dim": 128}, "native"),  # no partitioning rule
        ("cpu", 1, {"dtype": jnp.bfloat16, "head_dim": 128}, "native"),  # interpreted: opt-in
    ],
)
def test_tpu_attention_choice_follows_capabilities(monkeypatch, backend, devices, case, expected):
    monkeypatch.setattr(jax, "device_count", lambda: devices)
    a = _shapes(case["dtype"], case["head_dim"], seq=case.get("seq", 2048))
    segments = a["segments"] if case.get("segments", True) else None
    table = registry.OpTable(backend, from_env=False)
    chosen = table.choose("attention", a["q"], a["kv"], a["kv"], segment_ids=segments)
    assert chosen.name == expected


def test_forced_splash_names_what_it_cannot_serve(monkeypatch):
    monkeypatch.delenv("TITAN_OPS", raising=False)
    a = _shapes(jnp.bfloat16, 128, seq=2048)
    args = (a["q"], a["kv"], a["kv"])
    with pytest.raises(TitanError, match="head dim 64 must be a multiple of 128"):
        _trace_every_op(Ops("cpu", {"attention": "splash"}), head_dim=64, seq=256)
    with pytest.raises(TitanError, match="sequence length 200 must be a multiple of 128"):
        _trace_every_op(Ops("cpu", {"attention": "splash"}), head_dim=128, seq=200)
    tpu = registry.OpTable("tpu", {"attention": "splash"}, from_env=False)
    f32 = _shapes(jnp.float32, 128, seq=2048)
    with pytest.raises(TitanError, match="needs q, k, v in one of bfloat16 on tpu; got float32"):
        tpu.choose("attention", f32["q"], f32["kv"], f32["kv"])
    assert tpu.choose("attention", *args, segment_ids=a["segments"]).name == "splash"
    with pytest.raises(TitanError, match="unknown provider 'splash' for op attention on backend"):
        registry.OpTable("gpu", {"attention": "splash"}, from_env=False)


def test_no_kernel_is_interpreted_on_a_tpu():
    assert splash_attention.interprets("tpu") is False
    assert splash_attention.interprets("cpu") is True
    assert not splash_attention.interprets("rocm")
    assert platform.pallas_interpret("cpu") and not platform.pallas_interpret("tpu")
    assert not platform.pallas_runs_on("tpu")  # the Triton kernels are refused there


def test_splash_blocks_fit_the_sequence_in_multiples_of_128():
    blocks = splash_attention.SplashBlocks(block_q=1024, block_kv_dq=256)
    assert blocks.fit(2048) == blocks
    assert blocks.fit(384) == splash_attention.SplashBlocks(*[128] * 6)
    assert blocks.fit(1536).block_q == 512 and blocks.fit(1536).block_kv_dq == 256


@pytest.mark.slow
def test_splash_matches_native_with_gqa_causal_documents_and_windows():
    """Interpreted on CPU: forward and gradients against the float32 reference, grouped-query
    heads (H 2, K 1), causal with packed documents, 12 documents a row, and a one-sided window
    without the causal mask."""
    results = conformance.run_checks("cpu", "attention", "splash")
    splash_rows = [r for r in results if r.provider == "splash"]
    assert len(splash_rows) == 6 and all(r.status == "pass" for r in splash_rows)
    assert max(r.fwd_rel for r in splash_rows if r.dtype == "float32") < 1e-5
    assert max(r.bwd_rel for r in splash_rows if r.dtype == "float32") < 5e-5
    # and bf16 against the same float32 reference: the inputs' rounding, no more
    assert 1e-4 < max(r.fwd_rel for r in splash_rows if r.dtype == "bfloat16") < 2e-2


def test_conformance_compiles_each_reference_once_and_no_input_generator(monkeypatch):
    """Inputs come from NumPy and every argument is traced: the float32 reference of a case is
    compiled once for both dtypes, and nothing else but the providers' VJPs is compiled."""
    conformance._vjp_fn.cache_clear()
    jax.clear_caches()
    compiled: list[float] = []
    listener = lambda event, duration, **kw: (  # noqa: E731
        compiled.append(duration) if event == "/jax/core/compile/backend_compile_duration" else 0
    )
    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        results = conformance.run_checks("cpu", "rope")
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
    assert {r.status for r in results} == {"pass"}
    # two cases (one static scaling each) x (reference, native bf16, fused f32, fused bf16)
    assert len(compiled) == 8


def test_programs_compile_once_per_shape_and_carry_lowering_errors():
    square = jax.jit(lambda x: x * x)
    vector = (jax.ShapeDtypeStruct((4,), jnp.float32),)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        programs = conformance._Programs(pool)
        compiled = programs.submit(square, vector)
        assert programs.submit(square, (jax.ShapeDtypeStruct((4,), jnp.float32),)) is compiled
        assert programs.submit(square, (jax.ShapeDtypeStruct((8,), jnp.float32),)) is not compiled
        np.testing.assert_array_equal(compiled.result()(jnp.arange(4.0)), [0.0, 1.0, 4.0, 9.0])
        broken = programs.submit(jax.jit(lambda x: x.reshape(3)), vector)
        with pytest.raises(TypeError, match="reshape"):
            broken.result()  # raised where the provider's row is run: an ``error:`` row


def _equations(jaxpr):
    """Every equation of a jaxpr, those of sub-jaxprs (scan, checkpoint, custom_vjp) included."""
    for eqn in jaxpr.eqns:
        yield eqn
        for param in eqn.params.values():
            for sub in param if isinstance(param, (list, tuple)) else [param]:
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    yield from _equations(inner)


def _array_shapes(jaxpr):
    """Shapes of every value a jaxpr computes, sub-jaxprs included."""
    for eqn in _equations(jaxpr):
        yield from (var.aval.shape for var in eqn.outvars)


@pytest.mark.slow
def test_chunked_cross_entropy_matches_native_without_full_logits():
    batch, seq, dim, vocab, chunk = 2, 20, 8, 16, 6
    keys = jax.random.split(jax.random.key(0), 3)
    x = jax.random.normal(keys[0], (batch, seq, dim))
    w_out = jax.random.normal(keys[1], (dim, vocab))
    targets = jax.random.randint(keys[2], (batch, seq), 0, vocab)

    def loss(impl, **kw):
        return lambda x, w: jnp.sum(impl(x, w, targets, **kw) * jnp.arange(seq))

    chunked_loss = loss(chunked.cross_entropy, chunk_size=chunk)
    np.testing.assert_allclose(
        chunked.cross_entropy(x, w_out, targets, chunk_size=chunk),
        native.cross_entropy(x, w_out, targets),
        rtol=1e-6,
    )
    for got, want in zip(
        jax.jit(jax.grad(chunked_loss, (0, 1)))(x, w_out),
        jax.jit(jax.grad(loss(native.cross_entropy), (0, 1)))(x, w_out),
        strict=True,
    ):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)

    def largest_logits(fn) -> int:
        jaxpr = jax.make_jaxpr(jax.grad(fn, (0, 1)))(x, w_out).jaxpr
        return max(np.prod(s) for s in _array_shapes(jaxpr) if s and s[-1] == vocab)

    assert largest_logits(loss(native.cross_entropy)) == batch * seq * vocab
    assert largest_logits(chunked_loss) == batch * chunk * vocab


@pytest.mark.slow
def test_fused_cross_entropy_matches_native_and_its_backward_scatters_nothing():
    keys = jax.random.split(jax.random.key(1), 4)
    x = jax.random.normal(keys[0], (2, 24, 16), jnp.bfloat16)
    w_out = jax.random.normal(keys[1], (16, 40), jnp.bfloat16)
    targets = jax.random.randint(keys[2], (2, 24), 0, 40)
    weights = jax.random.normal(keys[3], (2, 24))

    def grads(impl):
        loss = lambda x, w: jnp.sum(impl(x, w, targets) * weights)  # noqa: E731
        return jax.value_and_grad(loss, (0, 1))

    (got_loss, got), (want_loss, want) = (
        grads(fused_loss.cross_entropy)(x, w_out),
        grads(native.cross_entropy)(x, w_out),
    )
    np.testing.assert_allclose(got_loss, want_loss, rtol=1e-6)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == jnp.bfloat16
        np.testing.assert_allclose(g.astype(np.float32), w.astype(np.float32), atol=1e-2)

    def primitives(impl) -> set[str]:
        jaxpr = jax.make_jaxpr(grads(impl))(x, w_out).jaxpr
        return {eqn.primitive.name for eqn in _equations(jaxpr)}

    assert "scatter-add" in primitives(native.cross_entropy)
    assert not {"scatter-add", "scatter"} & primitives(fused_loss.cross_entropy)


@pytest.mark.slow
def test_fused_rope_matches_native_and_its_backward_is_a_rotation():
    keys = jax.random.split(jax.random.key(2), 2)
    x = jax.random.normal(keys[0], (2, 24, 4, 16))
    weights = jax.random.normal(keys[1], x.shape)
    positions = jnp.tile(jnp.arange(24)[None], (2, 1)) + jnp.arange(2)[:, None]

    def grad(impl):
        return jax.value_and_grad(lambda x: jnp.sum(impl(x, positions, theta=500.0) * weights))

    (got_value, got), (want_value, want) = grad(fused_rope.rope)(x), grad(native.rope)(x)
    np.testing.assert_allclose(got_value, want_value, rtol=1e-6)
    np.testing.assert_allclose(got, want, atol=1e-6)
    bf16 = x.astype(jnp.bfloat16)
    np.testing.assert_array_equal(
        fused_rope.rope(bf16, positions, theta=500.0), native.rope(bf16, positions, theta=500.0)
    )

    def primitives(impl) -> set[str]:
        return {eqn.primitive.name for eqn in _equations(jax.make_jaxpr(grad(impl))(x).jaxpr)}

    # Autodiff transposes the native slices into pads; the fused backward rotates instead.
    assert "pad" in primitives(native.rope)
    assert "pad" not in primitives(fused_rope.rope)


@pytest.mark.slow
def test_pallas_swiglu_matches_native_and_its_backward_is_one_kernel():
    keys = jax.random.split(jax.random.key(3), 5)
    x = jax.random.normal(keys[0], (2, 8, 32))
    w_gate, w_up = (0.3 * jax.random.normal(k, (32, 256)) for k in keys[1:3])
    w_down = 0.1 * jax.random.normal(keys[3], (256, 32))
    weights = jax.random.normal(keys[4], x.shape)

    def grad(impl):
        loss = lambda *args: jnp.sum(impl(*args) * weights)  # noqa: E731
        return jax.value_and_grad(loss, argnums=(0, 1, 2, 3))

    args = (x, w_gate, w_up, w_down)
    (got_value, got), (want_value, want) = grad(swiglu.swiglu)(*args), grad(native.swiglu)(*args)
    np.testing.assert_allclose(got_value, want_value, rtol=1e-6)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
    bf16 = [a.astype(jnp.bfloat16) for a in args]
    np.testing.assert_array_equal(swiglu.swiglu(*bf16), native.swiglu(*bf16))

    def kernels(impl) -> list[str]:
        jaxpr = jax.make_jaxpr(grad(impl))(*args).jaxpr
        calls = [eqn for eqn in _equations(jaxpr) if eqn.primitive.name == "pallas_call"]
        return [eqn.params["name"] for eqn in calls]

    assert kernels(native.swiglu) == []
    assert kernels(swiglu.swiglu) == ["titan_swiglu_backward"]


@pytest.mark.slow
def test_pallas_swiglu_backward_stays_sharded_under_a_mesh():
    """Batch over dp, the MLP dim over tp: each device runs the kernel on its own tiles (without
    the partitioning rule XLA gathers the kernel's operands). 24 rows make 12 per device, not a
    multiple of 8, so the kernel's tiles follow the shard."""
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("dp", "tp"))
    keys = jax.random.split(jax.random.key(4), 4)
    x = jax.random.normal(keys[0], (4, 6, 32))
    w_gate, w_up = (0.3 * jax.random.normal(k, (32, 1024)) for k in keys[1:3])
    w_down = 0.1 * jax.random.normal(keys[3], (1024, 32))
    specs = (P("dp"), P(None, "tp"), P(None, "tp"), P("tp"))
    args = [
        jax.device_put(a, jax.sharding.NamedSharding(mesh, spec))
        for a, spec in zip((x, w_gate, w_up, w_down), specs, strict=True)
    ]

    def grads(impl):
        return jax.jit(jax.grad(lambda *a: jnp.sum(impl(*a) ** 2), argnums=(0, 1, 2, 3)))

    for g, w in zip(grads(swiglu.swiglu)(*args), grads(native.swiglu)(*args), strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)  # float32 sums in other orders
    compiled = grads(swiglu.swiglu).lower(*args).compile().as_text()
    assert "titan_swiglu_backward" in compiled
    assert "all-gather" not in compiled


@pytest.fixture(scope="module")
def ops_check_report() -> dict:
    """``titan ops check --json`` over the whole CPU grid, run once."""
    return json.loads(_run("-m", "titan.cli", "ops", "check", "--json").stdout)


@pytest.mark.slow
def test_ops_check_passes_every_provider_on_cpu_within_tolerance(ops_check_report):
    report = ops_check_report
    assert report["backend"] == "cpu" and report["failures"] == 0
    ran = {(r["op"], r["provider"], r["dtype"]) for r in report["results"] if r["status"] == "pass"}
    forced = [*OPT_IN.items(), ("attention", "splash")]  # splash: interpreted, TPU kernels
    for op, name in [*forced, *((op, "native") for op in registry.OPS)]:
        assert {(op, name, "float32"), (op, name, "bfloat16")} <= ran
    for row in report["results"]:
        if row["provider"] == "cudnn":
            assert row["status"] == "skipped: runs on gpu, cuda"
            continue
        tolerance = report["tolerances"][row["dtype"]]
        assert row["fwd_rel"] <= tolerance["fwd"] and row["bwd_rel"] <= tolerance["bwd"]
        assert row["time_ms"] is None  # no timing on CPU
    pallas_f32 = [
        r for r in report["results"] if r["provider"] == "pallas" and r["dtype"] == "float32"
    ]
    assert max(r["bwd_rel"] for r in pallas_f32) < 1e-5
    native_bf16 = [
        r for r in report["results"] if r["provider"] == "native" and r["dtype"] == "bfloat16"
    ]
    assert min(r["bwd_rel"] for r in native_bf16) > 1e-4  # bf16 is measurably inexact


def test_ops_check_prints_a_table_and_rejects_unknown_names(capsys):
    assert main(["ops", "check", "--op", "rope"]) == 0
    table, err = capsys.readouterr()
    assert "rope" in table and "pass" in table and "n/a (CPU)" in table
    cases = err.splitlines()  # where the check stands, case by case (not a terminal here)
    assert cases and cases[0].startswith(f"titan ops check: case 1/{len(cases)}: rope ")
    assert main(["ops", "check", "--op", "attn"]) == 2
    assert capsys.readouterr().err.strip() == (
        "titan ops check: error: --op must be one of attention, rms_norm, rope, swiglu, "
        "cross_entropy, modulate, patch_embed, got 'attn'"
    )
    assert main(["ops", "check", "--op", "rope", "--provider", "pallas"]) == 2
    assert "'pallas' is not registered for op rope; known: fused, native" in capsys.readouterr().err


def test_mfu_formulas_follow_the_baseline_file():
    bench = bench_module("mfu")
    shape = bench.Shape()
    layer = 2 * 2048 * 2048 + 2 * 2048 * 1024 + 3 * 2048 * 5632 + 2 * 2048
    params = 16 * layer + 2 * 32_000 * 2048 + 2048
    assert params == 886_114_304  # the baseline's params_b: 0.886114304
    non_embedding = params - 32_000 * 2048
    norms = 16 * 2 * 2048 + 2048  # the baseline counts RMSNorm scales in 6 N; titan counts matmuls
    causal = 6 * (non_embedding - norms) + 6 * 16 * 2048 * 2048
    assert bench.flops_per_token(shape, True) == causal
    assert bench.flops_per_token(shape, False) == causal + 6 * 16 * 2048 * 2048
    assert bench.flops_per_token(shape, True) == pytest.approx(
        6 * non_embedding + 6 * 16 * 2048 * 2048, rel=1e-4
    )
    assert bench.peak_flops("NVIDIA H200") == 989.5e12  # dense BF16, the GPU catalog
    assert bench.peak_flops("cpu") is None


@pytest.mark.slow
def test_mfu_bench_smoke_runs_titan_levers_against_a_baseline(tmp_path):
    baseline = tmp_path / "baseline.py"
    baseline.write_text(
        "import json, os\n"
        "print(json.dumps({'matmul_tflops': 1.0}))\n"
        "print(json.dumps({'cfg': {k: int(os.environ[k]) for k in 'LSB'}, "
        "'attn': os.environ['ATTN'], 'remat': os.environ['REMAT'] == '1', 'tok_s': 1000.0, "
        "'mfu_causal': 0.1, 'mfu_palm': 0.2, 'peak_mem_gb': 1.5}))\n"
    )
    out = tmp_path / "mfu.json"
    argv = ["--smoke", "--baseline", str(baseline), "--out", str(out), "--steps", "2"]
    done = _run(str(REPO / "bench" / "mfu.py"), *argv, "--warmup", "1")
    report = json.loads(out.read_text())
    assert report["baseline"]["cfg"] == {"L": 2, "S": 32, "B": 2}
    assert report["baseline"]["peak_mem_gib"] == 1.5
    runs = {run["lever"]: run for run in report["runs"]}
    assert list(runs) == [
        "start",
        "attention=pallas",
        "cross_entropy=chunked",
        "rope=fused",
        "swiglu=pallas",
    ]
    assert runs["attention=pallas"]["served"]["attention"] == "pallas"
    assert runs["cross_entropy=chunked"]["served"]["cross_entropy"] == "chunked"
    assert runs["start"]["served"]["rope"] == "native"
    assert runs["rope=fused"]["served"]["rope"] == "fused"
    assert runs["swiglu=pallas"]["served"]["swiglu"] == "pallas"
    for run in runs.values():
        assert run["tok_s"] > 0 and run["mfu_causal"] is None  # MFU unknown on CPU
        assert run["vs_baseline"] == pytest.approx(run["tok_s"] / 1000.0)
        # float32 on CPU: every provider computes the same training step
        assert run["loss"] == pytest.approx(runs["start"]["loss"], abs=1e-4)
    assert "| plain-JAX baseline | causal | cudnn | dots |" in done.stdout


def test_splash_gradients_without_remat_in_two_traces():
    """The backward pass of a step without remat (partial evaluation, not jit's tracing) reached
    a kernel kept from an earlier trace and raised UnexpectedTracerError on a v5e."""
    key = jax.random.PRNGKey(0)
    q = jax.random.normal(key, (1, 128, 2, 128), jnp.float32)
    kv = jax.random.normal(jax.random.PRNGKey(1), (1, 128, 1, 128), jnp.float32)
    segments = jnp.zeros((1, 128), jnp.int32)

    def loss(q, k, v):
        out = splash_attention.attention(q, k, v, segment_ids=segments)
        return jnp.sum(out**2)

    first = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(q, kv, kv)
    again = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))(q, kv, kv)[1]
    for a, b in zip(first, again, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5)


def test_large_attention_cases_shrink_their_batch_to_the_device_memory():
    v5e, h200 = 16_909_336_064, 150_000_000_000  # bytes_limit of each device
    assert conformance.attention_batch(32, 2048, v5e) == 2
    assert conformance.attention_batch(16, 2048, v5e) == 4
    assert conformance.attention_batch(32, 2048, h200) == 8
    assert conformance.attention_batch(32, 2048, None) == 8  # unknown: the model's own batch
    assert conformance.attention_batch(64, 65_536, v5e) == 1  # never below one
    shapes = [c.shape for c in conformance.cases("tpu", v5e) if c.op == "attention"]
    assert any(s.startswith("B2 S2048 H32") for s in shapes), shapes
    assert any(s.startswith("B4 S2048 H16") for s in shapes), shapes


def test_only_float32_programs_are_traced_at_float32_matmul_precision(monkeypatch):
    """Mosaic compiles no TPU kernel whose bfloat16 matmul asks for float32 precision ("Bad lhs
    type" on a v5e): the bfloat16 programs trace at the default precision, as a run does."""
    seen = []
    submit = conformance._Programs.submit

    def recording(self, fn, inputs):
        dtypes = {str(a.dtype) for a in inputs[0] if jnp.issubdtype(a.dtype, jnp.floating)}
        seen.append((frozenset(dtypes), jax.config.jax_default_matmul_precision))
        return submit(self, fn, inputs)

    monkeypatch.setattr(conformance._Programs, "submit", recording)
    results = conformance.run_checks(op="rms_norm")
    assert results and not any(r.failed for r in results)
    assert {p for d, p in seen if d == {"float32"}} == {"float32"}
    assert {p for d, p in seen if d == {"bfloat16"}} == {None}


def test_a_provider_that_served_no_case_is_named_in_the_json_as_in_the_exit(capsys):
    assert main(["ops", "check", "--op", "rms_norm", "--provider", "pallas", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["provider_served_no_case"] is None
    code = main(["ops", "check", "--op", "attention", "--provider", "cudnn", "--json"])
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert code == 1 and report["failures"] == 0 and report["provider_served_no_case"] == "cudnn"
    assert "provider 'cudnn' served no case on backend cpu" in captured.err
