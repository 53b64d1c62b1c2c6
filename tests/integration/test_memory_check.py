"""Memory: the planner's estimate is checked against usable device memory before compiling, the
compiled program's memory analysis is recorded, and peak memory is recorded only when measured."""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path

import jax
import pytest
from helpers import cli_args, events, run_in_process

from titan.analysis.report import memory_text
from titan.analysis.summarize import summarize_run_dir
from titan.cli import main
from titan.config import TrainConfig, model_config
from titan.errors import TitanError
from titan.layouts.memory_check import (
    AUTO_KERNELS,
    UNKNOWN_KERNELS,
    ProgramOverMemory,
    RematChoice,
    Traced,
    auto_kernels,
    check_memory,
    compiler_fits,
    program_over_memory,
    resolve_remat,
)
from titan.ops import Ops
from titan.remat import auto_candidates
from titan.telemetry.device_memory import host_memory_bytes, uncounted_temp_bytes
from titan.telemetry.events import Compile
from titan.telemetry.records import RunRecord
from titan.trainer.compilation import CompileWatch
from titan.trainer.progress import TrainProgress
from titan.trainer.train import _Built, _Compiler

VOCAB = 512
LAYOUT_DEVICES = 1
PARTS = ("argument_bytes", "output_bytes", "temp_bytes", "generated_code_bytes")


class _Cpu:
    """A device as the memory check sees it: its kind and (XLA:CPU) no memory figures."""

    device_kind = platform = "cpu"

    def memory_stats(self):
        return None


class _Gpu:
    """A device whose allocator reports a pool of ``limit`` bytes."""

    device_kind, platform = "NVIDIA H200", "cuda"

    def __init__(self, limit: int) -> None:
        self.limit = limit

    def memory_stats(self):
        return {"bytes_limit": self.limit, "peak_bytes_in_use": 0}


def _check(devices, served=None, **options):
    options.setdefault("remat", "none")  # the check runs on a resolved policy, never on auto
    cfg = TrainConfig.of(preset="tiny", compute_dtype="float32", dp=1, **options)
    traced = Traced(LAYOUT_DEVICES, "float32", served or {})
    model = model_config(cfg.model.shape, VOCAB)
    usable = cfg.debugging.debug_usable_memory
    return check_memory(model, cfg.compute, cfg.parallel, cfg.data, traced, devices, usable)


def _auto(devices, **options):
    cfg = TrainConfig.of(
        preset="tiny", compute_dtype="float32", dp=1, batch_size=64, seq_len=2048, **options
    )
    model = model_config(cfg.model.shape, VOCAB)
    return resolve_remat(model, cfg.trainer, LAYOUT_DEVICES, "float32", devices)


def test_cpu_devices_share_the_host_memory_and_an_absurd_batch_is_refused():
    host = host_memory_bytes()
    assert 0 < host <= os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    check = _check([_Cpu(), _Cpu()], batch_size=8, seq_len=32)
    assert check.checked and check.usable_bytes == host / 2
    assert check.source == "the host's memory shared by 2 CPU devices"
    with pytest.raises(TitanError, match=r"above the [\d,.]+ GB usable \(the host's memory"):
        _check([_Cpu()], batch_size=1 << 20, seq_len=4096)


def test_an_absurd_batch_is_refused_with_what_would_fit():
    fits = _check([_Gpu(80 * 10**9)], batch_size=8, seq_len=2048)
    assert fits.checked and fits.estimate_bytes < fits.usable_bytes == 80e9
    with pytest.raises(TitanError) as refused:
        _check([_Gpu(80 * 10**9)], batch_size=1 << 16, seq_len=2048)
    message = str(refused.value)
    assert "\n" not in message
    match = re.search(r"needs an estimated ([\d,.]+) GB per device .* above the 80\.00 GB", message)
    assert match and float(match.group(1).replace(",", "")) > 80
    batch = int(re.search(r"would fit: --batch-size (\d+)", message).group(1))
    assert 8 <= batch < 1 << 16
    assert _check([_Gpu(80 * 10**9)], batch_size=batch, seq_len=2048).checked
    with pytest.raises(TitanError):
        _check([_Gpu(80 * 10**9)], batch_size=batch + 1, seq_len=2048)
    assert "--no-memory-check runs anyway" in message


def test_a_remat_policy_that_fits_is_named():
    # at batch 64 no smaller batch is needed with full recomputation: the activations shrink
    none = _check([_Gpu(10**15)], batch_size=64, seq_len=2048, remat="none").estimate_bytes
    full = _check([_Gpu(10**15)], batch_size=64, seq_len=2048, remat="full").estimate_bytes
    assert full < none
    usable = int((none + full) / 2)
    with pytest.raises(TitanError, match=r"or --remat full"):
        _check([_Gpu(usable)], batch_size=64, seq_len=2048, remat="none")


def test_remat_auto_takes_the_fastest_policy_that_fits_on_accelerators():
    roomy = _auto([_Gpu(10**15)])
    assert roomy.remat == "dots-attention"
    assert roomy.line().startswith("--remat auto: dots-attention (an estimated ")
    assert _auto([_Gpu(10**15)], remat="full").estimate_bytes is None  # given: not estimated
    full, dots = (
        _check([_Gpu(10**15)], AUTO_KERNELS, batch_size=64, seq_len=2048, remat=r).estimate_bytes
        for r in ("full", "dots")
    )
    assert full < dots < roomy.estimate_bytes
    assert [r for r, _ in roomy.fallbacks] == ["dots", "full"]  # held by the compiled program
    assert _auto([_Gpu(int((full + dots) / 2))]).remat == "full"
    on_the_edge = _auto([_Gpu(int(dots) + 1)])  # the estimate alone: the compile then holds it
    assert on_the_edge.remat == "dots" and on_the_edge.fallbacks == (("full", full),)
    assert _auto([_Gpu(int(dots) - 1)]).remat == "full"
    tight = _auto([_Gpu(int(full / 2))])  # nothing fits: the last, which the check refuses
    assert tight.remat == "full" and tight.estimate_bytes > tight.usable_bytes
    assert not tight.fallbacks


def test_a_compiled_program_over_the_usable_memory_passes_auto_to_the_next_candidate():
    gb = 10**9
    choice = RematChoice(
        "dots-attention", 90 * gb, 100 * gb, (("dots", 88 * gb), ("full", 70 * gb))
    )
    held = choice.compiled(99 * gb)
    assert held == dataclasses.replace(choice, compiled_bytes=99 * gb)
    assert held.line() == (
        "--remat auto: dots-attention (an estimated 90.00 GB per device, compiled 99.00 GB, "
        "100.00 GB usable)"
    )
    assert choice.compiled(None) == choice  # no figure: kept
    dots = choice.compiled(101 * gb)
    assert (dots.remat, dots.estimate_bytes, dots.fallbacks) == (
        "dots",
        88 * gb,
        (("full", 70 * gb),),
    )
    full = dots.compiled(100 * gb + 1)
    assert (full.remat, full.fallbacks) == ("full", ())
    last = full.compiled(200 * gb)  # nothing left to try: kept, and the memory check speaks
    assert (last.remat, last.compiled_bytes) == ("full", 200 * gb)
    assert last.line() == (
        "--remat auto: full (an estimated 70.00 GB per device, compiled 200.00 GB, 100.00 GB "
        "usable); dots-attention compiled to 101.00 GB, over; dots compiled to 100.00 GB, over"
    )


def test_remat_auto_recomputes_nothing_on_the_cpu():
    choice = _auto([_Cpu()])
    assert choice.remat == "none" and choice.line() is None  # the one candidate: nothing said
    assert _auto([_Cpu()], remat="dots").remat == "dots"


def test_the_check_can_be_switched_off():
    check = _check([_Gpu(10**6)], batch_size=8, seq_len=32, memory_check=False)
    assert not check.checked and check.estimate_bytes > check.usable_bytes


@pytest.mark.slow
def test_train_refuses_a_run_above_usable_memory_with_one_line_and_exit_2(small_options, capsys):
    options = {**small_options, "run_id": "huge", "batch_size": 4096, "debug_usable_memory": 1e9}
    assert main(["train", *cli_args(options)]) == 2
    err = capsys.readouterr().err.strip()
    print(err)
    assert len(err.splitlines()) == 1
    assert "memory check: --batch-size 4096" in err and "(--debug-usable-memory)" in err
    assert re.search(r"would fit: --batch-size \d+", err)
    assert not (Path(small_options["runs_root"]) / "huge").exists()


@pytest.mark.slow
def test_compile_event_has_the_memory_analysis_and_steps_no_faked_peak(small_options):
    code, run_dir = run_in_process({**small_options, "run_id": "analysed", "steps": 2})
    assert code == 0
    (compile_event,) = [e for e in events(run_dir, "compile") if e["what"] == "train_step"]
    memory = compile_event["memory"]
    assert set(memory) == {
        "argument_bytes",
        "output_bytes",
        "alias_bytes",
        "temp_bytes",
        "generated_code_bytes",
    }
    assert memory["argument_bytes"] > 0 and memory["temp_bytes"] > 0
    assert memory["alias_bytes"] > 0  # the donated state
    assert all("peak_memory_bytes" not in e for e in events(run_dir, "step"))  # CPU: none
    (start,) = events(run_dir, "run_start")
    assert start["memory_check"]["usable_bytes"] == host_memory_bytes()  # one CPU device
    assert 0 < start["memory_check"]["estimate_bytes"] and start["memory_check"]["checked"]
    summary = summarize_run_dir(run_dir)
    program = memory["argument_bytes"] + memory["output_bytes"] - memory["alias_bytes"]
    program += memory["temp_bytes"] + memory["generated_code_bytes"]
    assert summary.compiled_memory_bytes == program
    assert summary.peak_memory_bytes is None
    assert summary.memory_estimate_bytes == start["memory_check"]["estimate_bytes"]
    assert memory_text(summary).startswith("peak not reported by the backend, compiled 0.")
    # a --remat auto candidate passed over (its program too large) is not the run's program
    record = RunRecord(run_dir, run_dir.name)
    record.emit(
        Compile(what="train_step", passed_over=True, memory={**memory, "temp_bytes": 10**12})
    )
    record.close()
    assert summarize_run_dir(run_dir).compiled_memory_bytes == program


@pytest.mark.parametrize(
    "memory",
    [None, "lots", {"argument_bytes": 1}, {**dict.fromkeys(PARTS, 1), "temp_bytes": "9"}],
    ids=["none", "text", "partial", "wrong-type"],
)
def test_a_compile_event_without_a_complete_analysis_has_no_program_bytes(memory):
    event = Compile.from_json({"type": "compile", "time": 1.0, "memory": memory})
    assert event.program_bytes is None
    whole = Compile(memory={**dict.fromkeys(PARTS, 10), "alias_bytes": 5})
    assert whole.program_bytes == 35


@pytest.mark.slow
def test_train_holds_auto_against_its_compiled_program_and_builds_the_next_candidate():
    cfg = TrainConfig.of(preset="tiny", compute_dtype="float32", dp=1, batch_size=8, seq_len=32)
    shape = model_config(cfg.model.shape, VOCAB)
    ops = Ops(jax.default_backend(), cfg.compute.ops)
    compiler = _Compiler(None, CompileWatch(), TrainProgress(1, 1))
    roomy = RematChoice("dots-attention", 1.0, 1e15, (("full", 1.0),))
    held = _Built.of(shape, ops, cfg.trainer, roomy, compiler)
    program = held.remat.compiled_bytes
    assert held.remat.remat == "dots-attention" and program and held.compiled
    assert held.compiled[0].program_bytes == program  # XLA's figure, as the compile event's
    tight = dataclasses.replace(roomy, usable_bytes=program - 1)
    built = _Built.of(shape, ops, cfg.trainer, tight, compiler)
    assert built.remat.remat == "full" and built.remat.passed_over == (("dots-attention", program),)
    # the candidate passed over is recorded first (its compilation is the run's time too)
    passed, kept = built.compiled or []
    assert passed.passed_over and passed.program_bytes == program
    assert passed.run_program_bytes is None
    assert kept.passed_over is None and built.remat.compiled_bytes == kept.run_program_bytes
    assert "dots-attention compiled to" in built.remat.line()
    given = _Built.of(shape, ops, cfg.trainer, RematChoice("dots"), compiler)
    assert given.compiled is None  # nothing to hold: compiled when the run starts


class _AmdGpu(_Gpu):
    device_kind, platform = "AMD Instinct MI300X", "rocm"


def test_remat_auto_prices_the_swiglu_the_registry_serves_unasked():
    # the fused SwiGLU keeps fewer bytes per layer, but ROCm runs the native one unless asked
    on_cuda, on_rocm = _auto([_Gpu(10**15)]), _auto([_AmdGpu(10**15)])
    assert on_cuda.remat == on_rocm.remat == "dots-attention"
    fused, native = (
        _check([_Gpu(10**15)], kernels, batch_size=64, seq_len=2048, remat="dots-attention")
        for kernels in (AUTO_KERNELS, {**UNKNOWN_KERNELS, "swiglu": "native"})
    )
    assert native.estimate_bytes > fused.estimate_bytes
    assert (on_cuda.estimate_bytes, on_rocm.estimate_bytes) == (
        fused.estimate_bytes,
        native.estimate_bytes,
    )


class _Tpu(_Gpu):
    """One v5e chip, with the pool JAX reported there (bytes_limit)."""

    device_kind, platform = "TPU v5 lite", "tpu"


ISSUE_SHAPE = "d_model=2048,n_layers=4,n_heads=16,n_kv_heads=8,ffn_dim=5632,vocab_size=32000"


@pytest.mark.parametrize(
    ("device", "options", "served"),
    [
        # the 0.32B shape of issue 62 on one v5e, attention served natively and by a kernel
        (_Tpu(16_910_000_000), {"batch_size": 8, "seq_len": 2048}, {"attention": "native"}),
        (_Tpu(16_910_000_000), {"batch_size": 8, "seq_len": 2048}, {"attention": "pallas"}),
        (_Tpu(8 * 10**9), {"batch_size": 16, "seq_len": 1024}, {"attention": "native"}),
        (_Gpu(10**11), {"batch_size": 32, "seq_len": 4096}, {"attention": "cudnn"}),
        (_AmdGpu(10**10), {"batch_size": 8, "seq_len": 2048, "fsdp": 1}, {"swiglu": "native"}),
    ],
)
def test_remat_auto_and_the_memory_check_give_one_estimate(device, options, served):
    cfg = TrainConfig.of(preset=ISSUE_SHAPE, compute_dtype="bfloat16", dp=1, **options)
    model = model_config(cfg.model.shape, VOCAB)
    choice = resolve_remat(model, cfg.trainer, LAYOUT_DEVICES, "bfloat16", [device], 0.0, served)
    ran = dataclasses.replace(cfg.compute, remat=choice.remat)
    traced = Traced(LAYOUT_DEVICES, "bfloat16", served)
    ran_check = dataclasses.replace(ran, memory_check=False)  # compared, not refused
    check = check_memory(model, ran_check, cfg.parallel, cfg.data, traced, [device])
    assert choice.estimate_bytes == check.estimate_bytes
    assert choice.usable_bytes == check.usable_bytes == device.limit


def test_the_estimate_before_the_trace_prices_the_kernels_served_unasked():
    cfg = TrainConfig.of(preset=ISSUE_SHAPE, compute_dtype="bfloat16", dp=1, batch_size=8)
    model = model_config(cfg.model.shape, VOCAB)
    v5e = [_Tpu(16_910_000_000)]
    before = resolve_remat(model, cfg.trainer, LAYOUT_DEVICES, "bfloat16", v5e)
    unasked = auto_kernels("tpu")
    kernel = resolve_remat(model, cfg.trainer, LAYOUT_DEVICES, "bfloat16", v5e, 0.0, unasked)
    native = {"attention": "native"}
    traced = resolve_remat(model, cfg.trainer, LAYOUT_DEVICES, "bfloat16", v5e, 0.0, native)
    assert before == kernel  # what auto_kernels assumes, until the trace says otherwise
    assert traced.estimate_bytes != before.estimate_bytes  # why titan train prices it again


def test_train_prices_auto_again_with_the_providers_that_served_and_builds_that_choice():
    cfg = TrainConfig.of(preset="tiny", compute_dtype="float32", dp=1, batch_size=8, seq_len=32)
    shape = model_config(cfg.model.shape, VOCAB)
    ops = Ops(jax.default_backend(), cfg.compute.ops)
    compiler = _Compiler(None, CompileWatch(), TrainProgress(1, 1))
    asked = []

    def reprice(served, choice):
        asked.append(served)
        return choice

    first = RematChoice("dots-attention", 1.0, 1e15, (("full", 1.0),))
    full = RematChoice("full", 2.0, 1e15)
    built = _Built.of(
        shape, ops, cfg.trainer, first, compiler, reprice=lambda served: reprice(served, full)
    )
    assert asked == [dict(ops.served)] and "attention" in asked[0]
    assert built.remat == full and built.traced and built.compiled is None
    same = RematChoice("dots-attention", 3.0, 1e15, (("full", 2.0),))
    kept = _Built.of(
        shape, ops, cfg.trainer, first, compiler, reprice=lambda served: reprice(served, same)
    )
    assert kept.remat.remat == "dots-attention" and kept.remat.estimate_bytes == 3.0
    assert kept.compiled and kept.remat.fallbacks == (("full", 2.0),)


# XLA:TPU's refusal as a TPU v5e printed it for a 0.32B Llama at 32 x 2048 tokens, --remat full.
TPU_REFUSAL = (
    "RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required for HLO "
    "temporaries (19.55G) exceeds available HBM (15.75G)."
)


def test_on_a_tpu_the_estimate_is_at_most_the_usable_memory_since_the_compiler_fits_it():
    assert compiler_fits("TPU v5 lite") and not compiler_fits("NVIDIA H200")
    cfg = TrainConfig.of(
        preset=ISSUE_SHAPE, compute_dtype="bfloat16", dp=1, batch_size=16, seq_len=2048
    )
    model = model_config(cfg.model.shape, 32_000)
    native = {"attention": "native"}
    v5e, gpu = _Tpu(16_909_336_064), _Gpu(16_909_336_064)
    tpu_choice = resolve_remat(model, cfg.trainer, LAYOUT_DEVICES, "bfloat16", [v5e], 0.0, native)
    # measured: estimated at 85.2 GB without remat, the program compiled to 17.0 GB and ran
    assert tpu_choice.remat == "none" and tpu_choice.estimate_bytes == v5e.limit
    gpu_choice = resolve_remat(model, cfg.trainer, LAYOUT_DEVICES, "bfloat16", [gpu], 0.0, native)
    assert gpu_choice.remat == "full" and gpu_choice.estimate_bytes > gpu.limit
    ran = dataclasses.replace(cfg.compute, remat="none")
    traced = Traced(LAYOUT_DEVICES, "bfloat16", native)
    assert check_memory(model, ran, cfg.parallel, cfg.data, traced, [v5e]).checked
    with pytest.raises(TitanError, match="memory check"):
        check_memory(model, ran, cfg.parallel, cfg.data, traced, [gpu])


def test_xla_refusing_a_program_over_the_memory_is_one_line_with_its_figure():
    over = program_over_memory(RuntimeError(f"compile failed\n{TPU_REFUSAL}\nmore"))
    assert over is not None and over.required_bytes == int(19.55 * 2**30)
    assert "\n" not in str(over) and TPU_REFUSAL in str(over) and "--batch-size" in str(over)
    assert program_over_memory(RuntimeError("INVALID_ARGUMENT: bad shape")) is None
    assert program_over_memory(RuntimeError("RESOURCE_EXHAUSTED: too many files")) is None


def test_a_program_xla_refuses_passes_auto_to_the_next_candidate():
    gb = 10**9
    choice = RematChoice("none", 16 * gb, 17 * gb, (("dots-attention", 13 * gb),))
    refused = choice.refused(int(19.55 * 2**30))
    assert refused is not None and refused.remat == "dots-attention" and not refused.fallbacks
    assert refused.refused(None) is None  # nothing left: the refusal stands
    assert "none compiled to 20.99 GB, over" in (refused.line() or "")
    assert "none refused by XLA" in (choice.refused(None).line() or "")


def test_train_builds_the_next_candidate_when_xla_refuses_the_program():
    cfg = TrainConfig.of(preset="tiny", compute_dtype="float32", dp=1, batch_size=8, seq_len=32)
    shape = model_config(cfg.model.shape, VOCAB)
    ops = Ops(jax.default_backend(), cfg.compute.ops)
    real = _Compiler(None, CompileWatch(), TrainProgress(1, 1))
    refusals = []

    def compiler(refuse):
        def compile_or_refuse(trainer):
            if len(refusals) < refuse:
                refusals.append(trainer)
                over = program_over_memory(RuntimeError(TPU_REFUSAL))
                assert over is not None
                raise over
            return real(trainer)

        return compile_or_refuse

    choice = RematChoice("none", 1.0, 1e15, (("full", 1.0),))
    built = _Built.of(shape, ops, cfg.trainer, choice, compiler(refuse=1))
    assert built.remat.remat == "full" and built.compiled and len(refusals) == 1
    refusals.clear()
    with pytest.raises(ProgramOverMemory) as refused:  # the last candidate refused too
        _Built.of(shape, ops, cfg.trainer, choice, compiler(refuse=2))
    message = str(refused.value)  # names what auto tried, and no policy left to try
    assert "--remat auto tried none, full and none fit" in message and "(dots" not in message
    assert "\n" not in message and "HLO temporaries (19.55G)" in message


def test_remat_auto_leaves_the_remat_to_the_compiler_first_on_a_tpu():
    assert auto_candidates("tpu")[0] == "none"
    assert auto_candidates("gpu")[0] == "dots-attention"


def test_a_tpu_peak_counts_the_program_temporaries_its_allocator_leaves_out():
    program = {"argument_bytes": 3, "temp_bytes": 12_411_483_136}
    assert uncounted_temp_bytes([_Tpu(1)], [None, program]) == 12_411_483_136
    assert uncounted_temp_bytes([_Gpu(1)], [program]) == 0
    assert uncounted_temp_bytes([], [program]) == 0
