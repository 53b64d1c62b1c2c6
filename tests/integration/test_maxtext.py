"""MaxText's models under Titan's layouts (Python 3.12+ with the [maxtext] extra; skipped where
maxtext is not importable; CI runs them under 3.12): each family builds with Titan's logical axes
and shardings, SPMD trains, every layout and pipeline schedule gives the one-device losses, and a
run resumes onto another layout."""

from __future__ import annotations

import logging
from pathlib import Path

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec

pytest.importorskip("maxtext", reason="maxtext installs on Python 3.12+ ([maxtext] extra)")

from helpers import events, run_in_process, small_run  # noqa: E402

from titan.checkpoint.hf_checkpoints import export_hf  # noqa: E402
from titan.checkpoint.maxtext_import import import_maxtext  # noqa: E402
from titan.config import ComputeOptions, ModelOptions  # noqa: E402
from titan.errors import TitanError  # noqa: E402
from titan.generation.loading import load_model  # noqa: E402
from titan.layouts.builders import build_adapter  # noqa: E402
from titan.models.adapters import maxtext as adapter_module  # noqa: E402
from titan.models.adapters import maxtext_errors  # noqa: E402
from titan.models.adapters.llama import LlamaAdapter  # noqa: E402
from titan.models.adapters.maxtext import MaxTextAdapter, MaxTextModel, titan_axis  # noqa: E402
from titan.models.adapters.maxtext_checkpoints import export_run, read_run_params  # noqa: E402
from titan.ops import Ops  # noqa: E402
from titan.parallel.chunks import cut_layers, join_layers, plan_chunks, whole_model  # noqa: E402
from titan.parallel.mesh import build_stage_meshes  # noqa: E402
from titan.shapes import ModelConfig  # noqa: E402

TINY = {
    "base_emb_dim": "32",
    "base_num_query_heads": "4",
    "base_num_kv_heads": "2",
    "base_mlp_dim": "64",
    "base_num_decoder_layers": "4",
    "head_dim": "8",
}
FAMILIES = {
    "llama2-7b": ("llama", {}),
    "mistral-7b": ("mistral", {}),
    "gemma2-2b": ("gemma2", {}),
    "qwen3-0.6b": ("qwen3", {}),
    "mixtral-8x7b": ("mixtral", {"num_experts": "4", "base_moe_mlp_dim": "64"}),
}
F32 = np.dtype(np.float32)
CPU = jax.sharding.SingleDeviceSharding(jax.devices("cpu")[0])
TRAIN_SET = " ".join(f"{k}={v}" for k, v in TINY.items())


def _adapter(name: str, **extra: str) -> MaxTextAdapter:
    settings = {**TINY, **FAMILIES.get(name, ("", {}))[1], **extra}
    return MaxTextAdapter(MaxTextModel(name, tuple(settings.items()), seq_len=16, vocab_size=128))


def _flat(tree) -> dict[str, object]:
    leaves = jax.tree_util.tree_flatten_with_path(tree, is_leaf=lambda x: x is None or _spec(x))
    return {jax.tree_util.keystr(path): leaf for path, leaf in leaves[0]}


def _spec(x) -> bool:
    return isinstance(x, PartitionSpec)


@pytest.mark.parametrize("name", list(FAMILIES))
def test_each_family_builds_with_titan_axes_and_shardings(name: str):
    adapter = _adapter(name)
    assert adapter.family == FAMILIES[name][0] and adapter.n_layers == 4
    shapes, logical = adapter.abstract_params(whole_model(4))
    names, axes = _flat(shapes), _flat(logical)
    assert "['token_embedder']['embedding']" in names
    query = [n for n in names if "['query']['kernel']" in n]
    assert query and all(names[q].shape[1] == 4 for q in query)  # layers on axis 1
    assert all(axes[q] == PartitionSpec("embed", "layers", "heads", "head_dim") for q in query)
    shardings = build_stage_meshes(1, 2, 2, 1)[0].param_shardings(shapes, logical)
    for q in query:
        assert _flat(shardings)[q].spec == PartitionSpec("fsdp", None, "tensor", None)
    embedding = _flat(shardings)["['token_embedder']['embedding']"].spec
    assert embedding == PartitionSpec("tensor", "fsdp")
    assert adapter.model_state(whole_model(4)) == {}
    model_flops, hardware_flops = adapter.token_flops()
    assert 0 < model_flops["causal"] < model_flops["full"] <= hardware_flops["full"]
    if not adapter.tied:
        assert _two_chunks_loss(adapter) == _whole_loss(adapter)


def _inputs(adapter: MaxTextAdapter):
    tokens = np.random.default_rng(0).integers(0, 128, (2, 17), dtype=np.int32)
    return adapter.stage_inputs({"tokens": tokens, "segment_ids": np.zeros((2, 16), np.int32)})


def _whole_loss(adapter: MaxTextAdapter) -> float:
    params = jax.jit(adapter.init_params)(jax.random.key(0))
    inputs, whole = _inputs(adapter), whole_model(4)
    forward = jax.jit(lambda p, x: adapter.forward(whole, p, x, inputs.every, inputs.last, F32))
    return float(forward(params, inputs.first))


def _two_chunks_loss(adapter: MaxTextAdapter) -> float:
    """The loss through two chunks cut from the whole model's parameters (a pipeline of 2)."""
    params, inputs = jax.jit(adapter.init_params)(jax.random.key(0)), _inputs(adapter)
    joined = join_layers([params], adapter.is_layer_stacked, adapter.layer_axis)
    x = inputs.first
    for chunk in plan_chunks(4, 2, 1):
        target = jax.tree.map(
            lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=CPU),
            adapter.abstract_params(chunk)[0],
        )
        part = cut_layers(joined, target, chunk, adapter.is_layer_stacked, adapter.layer_axis)
        x = jax.jit(lambda p, x, c=chunk: adapter.forward(c, p, x, inputs.every, inputs.last, F32))(
            part, x
        )
    return float(x)


def test_mixtral_counts_only_the_experts_a_token_takes():
    adapter = _adapter("mixtral-8x7b")
    dense = _adapter("mixtral-8x7b", num_experts_per_tok="4")
    assert adapter.param_count() == dense.param_count()
    assert adapter.token_flops()[0]["full"] < dense.token_flops()[0]["full"]


def test_a_logical_name_without_a_rule_is_named():
    with pytest.raises(TitanError, match="'activation_made_up' has no rule"):
        titan_axis("activation_made_up")


def test_families_with_what_titan_does_not_carry_are_refused():
    with pytest.raises(TitanError, match="does not carry multi-head latent attention"):
        _adapter("deepseek3-tiny")
    with pytest.raises(TitanError, match="does not carry quantisation"):
        _adapter("llama2-7b", quantization="int8")
    with pytest.raises(TitanError, match="set by --seq-len"):
        _adapter("llama2-7b", max_target_length="64")


BAD_SETTINGS = {
    "nosuchkey=1": r"^--maxtext-set nosuchkey: not a MaxText key$",
    "base_emb_dm=32": r"^--maxtext-set base_emb_dm: not a MaxText key \(close: base_emb_dim,",
    "base_emb_dim=abc": r"^--maxtext-set base_emb_dim=abc: Input should be a valid integer",
    "base_num_query_heads=3": r"^--maxtext-set base_num_query_heads=3: not a multiple of base_num",
    "base_emb_dim=-64": r"^--maxtext-set base_emb_dim=-64: must be > 0$",
    "attention=nosuch": r"^--maxtext-set attention=nosuch: not one of MaxText's attention kernels",
}


@pytest.mark.parametrize("setting", list(BAD_SETTINGS))
def test_bad_settings_are_one_line_naming_the_key(setting: str, caplog):
    key, value = setting.split("=")
    with caplog.at_level("DEBUG"), pytest.raises(TitanError, match=BAD_SETTINGS[setting]) as err:
        _adapter("llama2-7b", **{key: value})
    assert "\n" not in str(err.value) and len(str(err.value)) < 200
    assert caplog.records == []  # MaxText's logging is quiet while it is configured
    assert logging.root.manager.disable == logging.NOTSET  # and restored


def test_a_model_that_does_not_build_names_the_settings():
    err = maxtext_errors.build_error(ValueError("Invalid num_kv_heads.\nmore"), {"a": "1"})
    assert str(err) == "--maxtext-set a=1: MaxText cannot build the model: Invalid num_kv_heads."
    named = maxtext_errors.build_error(ValueError("bad head_dim"), {"a": "1", "head_dim": "3"})
    assert str(named) == "--maxtext-set head_dim=3: MaxText cannot build the model: bad head_dim"


def test_a_model_name_must_be_one_of_maxtexts():
    for name in ("../base", "nosuch-7b"):
        with pytest.raises(TitanError, match=f"^--maxtext-model {name}: no such MaxText model"):
            _adapter(name)


def test_tied_embeddings_are_not_cut_across_stages():
    adapter = _adapter("gemma2-2b")
    first, last = plan_chunks(4, 2, 1)
    with pytest.raises(TitanError, match="ties its embedding"):
        adapter.abstract_params(last)
    assert adapter.abstract_params(whole_model(4))  # SPMD keeps one copy


def test_no_persistent_compilation_cache_is_left(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    adapter_module.load_config.cache_clear()
    adapter_module.load_config(MaxTextModel("llama2-7b", tuple(TINY.items()), 16, 128))
    assert not jax.config.jax_compilation_cache_dir
    assert list(tmp_path.iterdir()) == []


def _options(corpus_dir: Path, root: Path, run_id: str, **extra) -> dict:
    # warmup of one step: the learning rates of steps 1-2 do not depend on the run's length
    options = small_run(corpus_dir, root, steps=4, warmup_steps=1, checkpoint_every=4)
    return {
        **options,
        "seq_len": 16,
        "model_source": "maxtext",
        "maxtext_model": "llama2-7b",
        "maxtext_set": TRAIN_SET,
        "run_id": run_id,
        **extra,
    }


def _losses(run_dir: Path) -> list[float]:
    return [e["loss"] for e in events(run_dir, "step")]


@pytest.fixture(scope="module")
def one_device(tmp_path_factory, corpus_dir: Path) -> Path:
    root = tmp_path_factory.mktemp("maxtext")
    code, run_dir = run_in_process(_options(corpus_dir, root, "one", dp=1))
    assert code == 0
    return run_dir


@pytest.mark.slow
def test_spmd_trains_and_records_maxtext(one_device: Path):
    losses = _losses(one_device)
    assert len(losses) == 4 and losses[-1] < losses[0] - 0.05
    start = events(one_device, "run_start")[0]
    assert start["model_source"]["layers_by"] == "maxtext 0.2.5"
    assert start["model_source"]["maxtext_model"] == "llama2-7b"
    assert start["param_count"] > 0 and start["model"]["name"] == "maxtext:llama2-7b"


LAYOUTS = {
    "fsdp-tp": {"dp": 1, "fsdp": 2, "tp": 2},
    "gpipe": {"layout": "mpmd", "pp": 2, "dp": 1, "microbatches": 2, "schedule": "gpipe"},
    "1f1b": {"layout": "mpmd", "pp": 2, "dp": 1, "microbatches": 2, "schedule": "1f1b"},
    "interleaved": {
        "layout": "mpmd",
        "pp": 2,
        "dp": 1,
        "microbatches": 2,
        "schedule": "interleaved-1f1b",
        "virtual_stages": 2,
    },
}


@pytest.mark.slow
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_layouts_equal_the_one_device_losses(
    layout: str, one_device: Path, corpus_dir: Path, tmp_path: Path
):
    code, run_dir = run_in_process(_options(corpus_dir, tmp_path, layout, **LAYOUTS[layout]))
    assert code == 0
    assert _losses(run_dir) == pytest.approx(_losses(one_device), rel=1e-5)


@pytest.mark.slow
def test_resume_onto_another_layout_continues_the_losses(
    one_device: Path, corpus_dir: Path, tmp_path: Path
):
    options = _options(corpus_dir, tmp_path, "resumed", steps=2, **LAYOUTS["1f1b"])
    code, run_dir = run_in_process(options)
    assert code == 0
    spmd = {"layout": "spmd", "pp": 1, "microbatches": 1, "schedule": "1f1b", "steps": 4}
    code, _ = run_in_process({**options, **LAYOUTS["fsdp-tp"], **spmd}, resume=run_dir)
    assert code == 0
    assert events(run_dir, "run_start")[-1]["resumed_from_step"] == 2
    assert _losses(run_dir)[2:] == pytest.approx(_losses(one_device)[2:], rel=1e-5)


@pytest.mark.slow
def test_a_maxtext_run_exports_into_titans_llama_with_the_same_loss(
    one_device: Path, tmp_path: Path
):
    exported, imported = tmp_path / "maxtext", tmp_path / "llama"
    assert export_run(one_device, exported)["settings"]["vocab_size"] == 512
    import_maxtext(exported, imported, one_device / "tokenizer.model")
    params, config, _ = read_run_params(imported)
    shape = ModelConfig(**config["model"])
    weights, _, _ = read_run_params(one_device)
    adapter = _adapter("llama2-7b", vocab_size="512")
    inputs = _inputs(adapter)
    whole = whole_model(4)
    maxtext = jax.jit(
        lambda p: adapter.forward(whole, p, inputs.first, inputs.every, inputs.last, F32)
    )
    llama = LlamaAdapter(shape, Ops("cpu", {}), seq_len=16)
    titan = jax.jit(lambda p: llama.forward(whole, p, inputs.first, inputs.every, inputs.last, F32))
    assert float(titan(params)) == pytest.approx(float(maxtext(weights)), abs=1e-5)


@pytest.mark.slow
def test_generate_and_export_hf_refuse_a_maxtext_run(one_device: Path, tmp_path: Path):
    with pytest.raises(TitanError, match="titan generate: .* then titan import maxtext"):
        load_model(str(one_device))
    with pytest.raises(TitanError, match="titan export hf: .* titan export maxtext, then"):
        export_hf(one_device, None, tmp_path / "hf")
    assert not (tmp_path / "hf").exists()


# Two scanned layers (gemma2: one (local, global) pair); mixtral with MaxText's load-balancing
# loss on (its yml leaves it 0).
TRAINED_FAMILIES = {
    "gemma2-2b": ("gemma2", {"base_num_decoder_layers": "1"}),
    "qwen3-0.6b": ("qwen3", {}),
    "mixtral-8x7b": (
        "mixtral",
        {"num_experts": "4", "base_moe_mlp_dim": "64", "load_balance_loss_weight": "0.01"},
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(TRAINED_FAMILIES))
def test_each_family_trains_through_the_trainer(name: str, corpus_dir: Path, tmp_path: Path):
    family, extra = TRAINED_FAMILIES[name]
    settings = {**TINY, "base_num_decoder_layers": "2", **extra}
    options = _options(corpus_dir, tmp_path, name, dp=1, steps=2)
    options["maxtext_model"] = name
    options["maxtext_set"] = " ".join(f"{k}={v}" for k, v in settings.items())
    code, run_dir = run_in_process(options)
    assert code == 0
    losses = _losses(run_dir)
    assert len(losses) == 2 and all(np.isfinite(losses))
    source = events(run_dir, "run_start")[0]["model_source"]
    assert source["family"] == family and source["maxtext_model"] == name
    assert source["load_balance_loss_weight"] == float(extra.get("load_balance_loss_weight", 0))
    balance = [e.get("moe_lb_loss") for e in events(run_dir, "step")]
    if family == "mixtral":  # its own field of the step record, a term of the loss
        # MaxText's load_balance_loss: weight x E x sum_i(density_i x probability_i), E = 4
        assert all(0 < b <= 4 * 0.01 for b in balance)
        # the experts' MLP sharded over the tensor axis gives the one-device losses
        code, tensor_run = run_in_process({**options, "tp": 2, "run_id": "tp"})
        assert code == 0 and _losses(tensor_run) == pytest.approx(losses, rel=1e-5)
    else:
        assert balance == [None, None]


def test_the_load_balancing_loss_is_a_named_term_of_one_stage_only():
    balanced = _adapter("mixtral-8x7b", load_balance_loss_weight="0.01")
    assert balanced.loss_terms() == ("moe_lb_loss",) and _adapter("qwen3-0.6b").loss_terms() == ()
    with pytest.raises(TitanError, match="load-balancing loss .* not carried across pipeline"):
        balanced.abstract_params(plan_chunks(4, 2, 1)[0])


@pytest.mark.parametrize("kernel", ["flash", "cudnn_flash_te", "cudnn_flash_jax"])
def test_an_attention_kernel_of_accelerators_is_refused_on_the_cpu_in_one_line(kernel: str):
    settings = {**TINY, "attention": kernel}
    model = ModelOptions(model_source="maxtext", maxtext_model="llama2-7b", maxtext_set=settings)
    shape = ModelConfig("t", 128, 32, 4, 4, 2, 64)
    with pytest.raises(TitanError, match=f"^--maxtext-set attention={kernel}: needs a GPU"):
        build_adapter(shape, model, ComputeOptions(), 16, Ops("cpu"))


def test_a_check_across_keys_names_the_settings_it_mentions():
    """pydantic's model validators give no location: the error names the keys its text does."""

    class CrossKeyError(ValueError):
        def errors(self):
            return [{"loc": (), "msg": "base_mlp_dim must equal base_moe_mlp_dim"}]

    settings = {"base_emb_dim": "64", "base_mlp_dim": "128"}
    err = maxtext_errors.config_error(CrossKeyError(), settings)
    assert str(err) == "--maxtext-set base_mlp_dim=128: base_mlp_dim must equal base_moe_mlp_dim"
