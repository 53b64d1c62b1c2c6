"""MaxText params checkpoints and Titan's Llama (no maxtext needed: runs on Python 3.11 too). The
fixture was written once by MaxText 0.2.5 (tests/fixtures/make_maxtext_fixture.py), with
MaxText's own per-token loss on a fixed batch."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
import tokenizers as hf_tokenizers
from helpers import run_in_process, small_run
from safetensors.numpy import load_file

from titan.checkpoint.init_from import init_from_options
from titan.checkpoint.maxtext_import import import_maxtext
from titan.cli import main
from titan.data.tokenizer import load_tokenizer
from titan.errors import TitanError
from titan.generation.generate import load_model
from titan.models.adapters.llama import LlamaAdapter
from titan.models.adapters.maxtext_checkpoints import (
    llama_to_maxtext,
    maxtext_to_llama,
    read_maxtext_params,
    read_run_params,
    rope_settings,
    write_maxtext_params,
)
from titan.models.hf_llama import params_to_hf
from titan.ops import Ops
from titan.parallel.chunks import whole_model
from titan.shapes import ModelConfig

FIXTURE = Path(__file__).parents[1] / "fixtures" / "maxtext_llama2_tiny"
REFERENCE = json.loads((FIXTURE / "reference.json").read_text())


def _per_token_loss(params: dict, shape) -> np.ndarray:
    """Titan's Llama per-token loss (B, S) on the fixture's tokens (one document per row)."""
    adapter = LlamaAdapter(shape, Ops("cpu", {}), seq_len=16)
    tokens = jnp.asarray(REFERENCE["tokens"], jnp.int32)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    positions = jnp.broadcast_to(jnp.arange(inputs.shape[1]), inputs.shape)
    module = adapter.module(whole_model(shape.n_layers))
    return np.asarray(
        module.apply({"params": params}, inputs, positions, jnp.zeros_like(inputs), targets)
    )


def _read_imported(out: Path) -> tuple[dict, ModelConfig]:
    """The parameters (numpy) and shape of a ``titan import maxtext`` output."""
    params, config, step = read_run_params(out)
    assert step == 0 and config["maxtext_import"]["source"]
    return params, ModelConfig(**config["model"])


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory, corpus_dir: Path) -> Path:
    """A character-level BPE ``tokenizer.json`` of at most 128 tokens (the fixture's vocabulary)
    with its BOS and EOS."""
    directory = tmp_path_factory.mktemp("tokenizer")
    tok = hf_tokenizers.Tokenizer(hf_tokenizers.models.BPE())
    trainer = hf_tokenizers.trainers.BpeTrainer(
        vocab_size=100, special_tokens=["<s>", "</s>"], limit_alphabet=60
    )
    tok.train_from_iterator([p.read_text() for p in sorted(corpus_dir.iterdir())[:2]], trainer)
    tok.save(str(directory / "tokenizer.json"))
    config = {"bos_token": "<s>", "eos_token": "</s>", "add_bos_token": True}
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return directory / "tokenizer.json"


@pytest.fixture(scope="module")
def imported(tmp_path_factory, tokenizer: Path) -> Path:
    out = tmp_path_factory.mktemp("imported") / "llama"
    args = ["import", "maxtext", str(FIXTURE / "checkpoint"), "--out", str(out)]
    assert main([*args, "--tokenizer", str(tokenizer)]) == 0
    return out


@pytest.mark.slow
def test_a_maxtext_checkpoint_imports_with_maxtexts_per_token_loss(imported: Path):
    params, shape = _read_imported(imported)
    assert (shape.d_model, shape.n_layers, shape.n_heads, shape.n_kv_heads) == (32, 2, 4, 2)
    assert (shape.ffn_dim, shape.vocab_size, shape.rope_theta) == (64, 128, 10000.0)
    loss = _per_token_loss(params, shape)
    expected = np.asarray(REFERENCE["per_token_loss"], np.float32)
    assert loss.shape == expected.shape == (2, 16)
    np.testing.assert_allclose(loss, expected, rtol=0, atol=1e-5)


def test_the_converter_scales_the_query_and_moves_the_layer_axis():
    weights = read_maxtext_params(FIXTURE / "checkpoint")
    params = maxtext_to_llama(weights)
    query = np.asarray(weights["decoder"]["layers"]["self_attention"]["query"]["kernel"])
    assert query.shape == (32, 2, 4, 8) and params["layers"]["wq"].shape == (2, 32, 4, 8)
    np.testing.assert_array_equal(params["layers"]["wq"][1], query[:, 1] * np.float32(8**0.5))
    back = llama_to_maxtext(params)
    for path in (("token_embedder", "embedding"), ("decoder", "layers", "mlp", "wo", "kernel")):
        a, b = weights, back
        for key in path:
            a, b = a[key], b[key]
        np.testing.assert_array_equal(np.asarray(a), b)


@pytest.fixture(scope="module")
def llama_run(tmp_path_factory, corpus_dir: Path) -> Path:
    """A 1-step run of Titan's Llama with head_dim 16 (sqrt 4: the query scaling is exact)."""
    root = tmp_path_factory.mktemp("llama16")
    shape = "d_model=64,n_layers=2,n_heads=4,n_kv_heads=2,ffn_dim=128,vocab_size=512"
    options = small_run(corpus_dir, root, steps=1, checkpoint_every=1, dp=1, run_id="hd16")
    code, run_dir = run_in_process({**options, "preset": shape})
    assert code == 0
    return run_dir


@pytest.mark.slow
def test_export_then_import_round_trips_bit_exact(llama_run: Path, tmp_path: Path):
    exported = tmp_path / "maxtext"
    assert main(["export", "maxtext", str(llama_run), "--out", str(exported)]) == 0
    args = ["import", "maxtext", str(exported), "--out", str(tmp_path / "back")]
    assert main([*args, "--tokenizer", str(llama_run / "tokenizer.model")]) == 0
    original, _, step = read_run_params(llama_run)
    back, shape = _read_imported(tmp_path / "back")
    assert step == 1 and shape.d_model == 64 and shape.head_dim == 16
    flat_a, flat_b = _flat(original), _flat(back)
    assert flat_a.keys() == flat_b.keys()
    for name, value in flat_a.items():
        np.testing.assert_array_equal(value, flat_b[name], err_msg=name)


def _flat(tree: dict, prefix: str = "") -> dict[str, np.ndarray]:
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}/"))
        else:
            out[prefix + key] = np.asarray(value)
    return out


@pytest.mark.slow
def test_the_import_is_a_checkpoint_that_export_hf_generate_and_init_from_take(
    imported: Path, tokenizer: Path, tmp_path: Path
):
    params, shape = _read_imported(imported)
    assert main(["export", "hf", str(imported), "--out", str(tmp_path / "hf")]) == 0
    tensors = load_file(str(tmp_path / "hf" / "model.safetensors"))
    expected = params_to_hf(params, shape)
    assert tensors.keys() == expected.keys()
    for name, value in expected.items():
        np.testing.assert_array_equal(tensors[name], value, err_msg=name)
    loaded = load_model(str(imported), None)  # what titan generate samples from
    assert (
        loaded.step == 0 and loaded.tokenizer.model_proto == load_tokenizer(tokenizer).model_proto
    )
    np.testing.assert_array_equal(np.asarray(loaded.params["embed"]), params["embed"])
    options = init_from_options({"init_from": str(imported)})
    assert options["preset"] == shape and options["tokenizer"] == str(imported / "tokenizer.model")


def test_import_refuses_what_is_not_a_maxtext_checkpoint(tmp_path: Path, tokenizer, capsys):
    args = ["import", "maxtext", str(tmp_path), "--out", str(tmp_path / "x")]
    assert main([*args, "--tokenizer", str(tokenizer)]) == 2
    assert "not a MaxText params checkpoint" in capsys.readouterr().err
    with pytest.raises(TitanError, match="exists"):
        import_maxtext(FIXTURE / "checkpoint", tmp_path, tokenizer)


@pytest.mark.slow
def test_import_refuses_a_tokenizer_larger_than_the_embedding(llama_run: Path, tmp_path: Path):
    out = tmp_path / "o"
    with pytest.raises(TitanError, match="512 tokens, more than the checkpoint's 128"):
        import_maxtext(FIXTURE / "checkpoint", out, llama_run / "tokenizer.model")
    assert not out.exists()


@pytest.mark.slow
def test_export_fails_at_once_when_out_is_under_a_regular_file(llama_run, tmp_path, capsys):
    (tmp_path / "afile").write_text("x")
    out = tmp_path / "afile" / "sub"
    assert main(["export", "maxtext", str(llama_run), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"--out {out}" in err and "not a directory" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]


@pytest.mark.parametrize(
    ("flag", "value", "rule"),
    [
        *(("--rope-theta", v, "a finite number > 1") for v in ("-5", "0", "0.5", "1e400")),
        *(("--norm-eps", v, "a number in (0, 1)") for v in ("-5", "0", "5", "nan")),
    ],
)
def test_import_refuses_a_rope_theta_or_norm_eps_no_model_takes(
    tmp_path, tokenizer, capsys, flag, value, rule
):
    out = tmp_path / "o"
    args = ["import", "maxtext", str(FIXTURE / "checkpoint"), "--out", str(out), flag, value]
    assert main([*args, "--tokenizer", str(tokenizer)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and flag in err and f"must be {rule}" in err
    assert not out.exists()


@pytest.mark.parametrize(
    "path",
    [
        ("decoder", "layers", "mlp", "wi_1", "kernel"),  # an FFN narrower than wi_0's
        ("decoder", "logits_dense", "kernel"),  # a head of another vocabulary
    ],
)
def test_import_refuses_arrays_that_disagree_in_shape_and_writes_nothing(
    tmp_path, tokenizer, capsys, path
):
    weights = read_maxtext_params(FIXTURE / "checkpoint")
    tree = weights
    for key in path[:-1]:
        tree = tree[key]
    value = np.asarray(tree[path[-1]])
    tree[path[-1]] = np.zeros((*value.shape[:-1], value.shape[-1] - 8), value.dtype)
    write_maxtext_params(tmp_path / "bad", weights)
    out = tmp_path / "o"
    args = ["import", "maxtext", str(tmp_path / "bad"), "--out", str(out)]
    assert main([*args, "--tokenizer", str(tokenizer)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "shape" in err
    assert "titan import maxtext: error: parameter" in err
    assert not out.exists()


def test_a_truncated_checkpoint_file_is_one_line(tmp_path, tokenizer, capsys):
    shutil.copytree(FIXTURE / "checkpoint", tmp_path / "cut")
    largest = max((p for p in (tmp_path / "cut").rglob("*") if p.is_file()), key=_size)
    largest.write_bytes(largest.read_bytes()[: _size(largest) // 2])
    out = tmp_path / "o"
    args = ["import", "maxtext", str(tmp_path / "cut"), "--out", str(out)]
    assert main([*args, "--tokenizer", str(tokenizer)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "the checkpoint cannot be read" in err
    assert not out.exists()


def _size(path: Path) -> int:
    return path.stat().st_size


def test_llama31_rope_scaling_is_carried_into_maxtexts_settings_and_others_refused():
    llama31 = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}
    llama31["original_max_position_embeddings"] = 8192
    assert rope_settings(None, "run") == {}
    assert rope_settings(llama31, "run") == {"rope_type": "llama3.1"}
    with pytest.raises(TitanError, match="^run: RoPE scaling \\(factor 32.0, .* not MaxText's"):
        rope_settings({**llama31, "factor": 32.0}, "run")
