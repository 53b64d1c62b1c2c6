"""``titan generate``: the KV-cache decoder against full forward passes, on the checkpoint of a
real MPMD run (its two stages' chunks joined into the whole model), sampling and the CLI."""

from __future__ import annotations

import dataclasses
import functools
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest

from titan.cli import main
from titan.data.tokenizer import load_tokenizer
from titan.errors import TitanError
from titan.generation.generate import (
    Generator,
    Sampling,
    check_cache_fits,
    check_prompt,
    new_token_budget,
    printable,
)
from titan.generation.loading import LoadedModel, load_model
from titan.generation.next_token import sample
from titan.models.llama import LlamaStage
from titan.ops import Ops
from titan.ops.native import rms_norm
from titan.shapes import resolve_model

NEW_TOKENS = 12
PROMPT = "def main("  # one prompt and length throughout: the decoder compiles once


@pytest.fixture(scope="module")
def pipeline_run(mpmd_eval_run):
    """A 5-step MPMD run (2 stages of 1 layer) with its checkpoint at step 5."""
    return mpmd_eval_run


@pytest.fixture(scope="module")
def loaded(pipeline_run):
    return load_model(str(pipeline_run))


@pytest.fixture(scope="module")
def generator(loaded):
    return Generator(loaded)


def full_forward_argmax(loaded, ids: list[int], length: int) -> int:
    """The argmax of the last position's logits from the training model's own forward pass over
    all of ``ids``, no cache: the blocks of :class:`LlamaStage`, then the final norm and the
    head. ``ids`` are padded to ``length`` (causal: the padding after them changes nothing) so
    that the pass compiles once."""
    padded = jnp.asarray([ids + [0] * (length - len(ids))], jnp.int32)
    return int(_logits(loaded.model, loaded.params, padded)[len(ids) - 1].argmax())


@functools.partial(jax.jit, static_argnums=0)
def _logits(model, params, tokens):
    body = LlamaStage(model, Ops("cpu"), model.n_layers, has_head=False)
    positions = jnp.arange(tokens.shape[1])[None]
    weights = {"embed": params["embed"], "layers": params["layers"]}
    hidden = body.apply({"params": weights}, tokens, positions, jnp.ones_like(tokens))
    return rms_norm(hidden, params["final_norm"], eps=model.norm_eps)[0] @ params["head"]


@pytest.mark.slow
def test_stage_checkpoints_join_into_the_whole_model(pipeline_run, loaded):
    """Layer 0 comes from stage 0's chunk, layer 1 from stage 1's; the embedding from the
    first, the head from the last."""
    path = pipeline_run / "checkpoints" / "5"
    reader = ocp.StandardCheckpointer()
    first, last = (reader.restore(path / f"chunk_{c}")["params"] for c in (0, 1))
    joined = np.concatenate([first["layers"]["wq"], last["layers"]["wq"]])
    np.testing.assert_array_equal(np.asarray(loaded.params["layers"]["wq"]), joined)
    np.testing.assert_array_equal(np.asarray(loaded.params["embed"]), first["embed"])
    np.testing.assert_array_equal(np.asarray(loaded.params["head"]), last["head"])
    assert loaded.step == 5


@pytest.mark.slow
def test_greedy_decoding_is_the_argmax_of_full_forward_passes(loaded, generator):
    prompt = generator.prompt_ids(PROMPT)
    greedy = Sampling(max_new_tokens=NEW_TOKENS, temperature=0.0)
    cached = list(generator.tokens(prompt, greedy))
    expected, ids = [], list(prompt)
    for _ in range(NEW_TOKENS):
        token = full_forward_argmax(loaded, ids, len(prompt) + NEW_TOKENS)
        if token == loaded.tokenizer.eos_id:
            break
        expected.append(token)
        ids.append(token)
    assert cached == expected
    assert len(cached) >= 3  # the 5-step model says EOS after a few tokens, not at once
    assert list(generator.tokens(prompt, greedy)) == cached  # deterministic


@pytest.mark.slow
def test_streamed_text_is_the_decode_of_the_new_tokens(loaded, generator):
    out = io.StringIO()
    sampling = Sampling(max_new_tokens=NEW_TOKENS, temperature=1.0, top_p=0.9, seed=5)
    ids = generator.stream(PROMPT, sampling, out)
    prompt = generator.prompt_ids(PROMPT)
    decode = loaded.tokenizer.decode
    continuation = decode(prompt + ids)[len(decode(prompt)) :]
    assert out.getvalue() == PROMPT + printable(continuation) + "\n"
    assert len(ids) == NEW_TOKENS
    assert generator.stream(PROMPT, sampling, io.StringIO()) == ids  # same seed


@pytest.mark.slow
def test_generation_stops_at_every_end_token_the_tokenizers_config_names(
    loaded, generator, tmp_path
):
    """A real tokenizer whose generation_config.json names EOS and a second end token (as Llama
    3 Instruct's names <|end_of_text|> and <|eot_id|>): greedy decoding stops before the second
    one, which is not printed."""
    prompt = generator.prompt_ids(PROMPT)
    greedy = Sampling(max_new_tokens=NEW_TOKENS, temperature=0.0)
    free = list(generator.tokens(prompt, greedy))
    end = free[3]
    expected = free[: free.index(end)]
    (tmp_path / "tokenizer.model").write_bytes(loaded.tokenizer.processor.serialized_model_proto())
    ends = {"eos_token_id": [loaded.tokenizer.eos_id, end]}
    (tmp_path / "generation_config.json").write_text(json.dumps(ends))
    tokenizer = load_tokenizer(tmp_path / "tokenizer.model")
    ending = Generator(dataclasses.replace(loaded, tokenizer=tokenizer))
    assert list(ending.tokens(prompt, greedy)) == expected
    out = io.StringIO()
    assert ending.stream(PROMPT, greedy, out) == expected
    decode = tokenizer.decode
    assert (
        out.getvalue()
        == PROMPT + printable(decode(prompt + expected)[len(decode(prompt)) :]) + "\n"
    )


@pytest.mark.slow
def test_stop_adds_end_tokens_by_id_or_by_text(pipeline_run, loaded, generator, capsys):
    prompt = generator.prompt_ids(PROMPT)
    free = list(generator.tokens(prompt, Sampling(max_new_tokens=NEW_TOKENS)))
    end = free[2]
    expected = free[: free.index(end)]
    piece = loaded.tokenizer.processor.id_to_piece(end)
    for stop in (str(end), piece):
        stopping = Sampling(max_new_tokens=NEW_TOKENS, stop=(stop,))
        assert list(generator.tokens(prompt, stopping)) == expected, stop
    out = io.StringIO()
    generator.stream(PROMPT, Sampling(max_new_tokens=NEW_TOKENS, stop=(piece,)), out)
    args = ["generate", str(pipeline_run), "--prompt", PROMPT, "--max-new-tokens", "12"]
    assert main([*args, "--stop", str(loaded.tokenizer.eos_id), "--stop", str(end)]) == 0
    assert capsys.readouterr().out == out.getvalue()


def test_nucleus_sampling_keeps_only_the_most_probable_tokens():
    logits = jnp.log(jnp.asarray([[0.5, 0.3, 0.15, 0.05]], jnp.float32))
    rows = jnp.broadcast_to(logits, (256, 4))  # 256 independent draws, one per row
    drawn = jax.jit(lambda t, p: sample(rows, jax.random.key(0), t, p, 4))

    def kept(temperature, top_p):
        return set(np.asarray(drawn(np.float32(temperature), np.float32(top_p))).tolist())

    assert kept(1.0, 0.7) == {0, 1}  # 0.5 < 0.7 <= 0.5 + 0.3
    assert kept(1.0, 1.0) == {0, 1, 2, 3}
    assert kept(1.0, 0.4) == {0}
    assert kept(0.0, 1.0) == {0}  # greedy
    beyond_vocab = sample(jnp.asarray([[0.0, 0.0, 9.0]]), jax.random.key(0), 0.0, 1.0, 2)
    assert int(beyond_vocab[0]) == 0


TINY_TEMPERATURES = """
import jax, jax.numpy as jnp
from titan.generation.next_token import sample
logits = 3 * jax.random.normal(jax.random.key(0), (4, 512))
draw = jax.jit(sample, static_argnames="vocab")
for t in (1e-6, 1e-9, 1e-10, 1e-20, 1e-30, 1e-45):
    drawn = draw(logits, jax.random.key(1), jnp.float32(t), jnp.float32(1.0), vocab=512)
    print(t, bool((drawn == jnp.argmax(logits, axis=-1)).all()))
"""


@pytest.mark.slow
def test_a_tiny_temperature_draws_the_argmax():
    # XLA:CPU as users run it: the suite's --xla_backend_optimization_level=0 hid the NaN
    env = {**os.environ, "XLA_FLAGS": "", "JAX_PLATFORMS": "cpu"}
    done = subprocess.run(
        [sys.executable, "-c", TINY_TEMPERATURES], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [
        word for t in ("1e-06", "1e-09", "1e-10", "1e-20", "1e-30", "1e-45") for word in (t, "True")
    ]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--top-p", "0"], "--top-p must be in (0, 1]"),
        (["--temperature", "-1"], "--temperature must be in [0, 100] (0: greedy), got -1.0"),
        (["--max-new-tokens", "0"], "--max-new-tokens must be >= 1"),
        (["--max-new-tokens", "100000000"], "--max-new-tokens 100000000: the run's model attends"),
        (["--step", "1"], "has no checkpoint of it (it has: 5)"),
        (["--stop", "512"], "--stop '512': neither a token id below 512 nor the text of one"),
        (["--stop", "no such token"], "--stop 'no such token': neither a token id below 512"),
        # bytes that are not UTF-8, as the shell passes $'a\xff' (Python: a lone surrogate)
        (["--prompt", os.fsdecode(b"a\xff")], "--prompt: not UTF-8 text (byte 1: 0xff)"),
    ],
)
def test_bad_generate_input_is_one_line_and_exit_2(pipeline_run, capsys, args, message):
    assert main(["generate", str(pipeline_run), "--prompt", "x", *args]) == 2
    err = capsys.readouterr().err
    assert message in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.slow
def test_generate_cli_streams_from_a_checkpoint_path(pipeline_run, capsys):
    checkpoint = pipeline_run / "checkpoints" / "5"
    assert main(["generate", str(checkpoint), "--prompt", "class", "--max-new-tokens", "1"]) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith("class")
    assert "step 5" in captured.err
    assert main(["generate", str(pipeline_run.parent), "--prompt", "x"]) == 2
    assert "neither a run dir" in capsys.readouterr().err


@pytest.mark.slow
def test_generate_header_shows_a_hostile_run_dir_inert(pipeline_run, tmp_path, capsys):
    hostile = tmp_path / "e\x1b[31mDIR[bold]x"
    hostile.symlink_to(pipeline_run, target_is_directory=True)
    assert main(["generate", str(hostile), "--prompt", "class", "--max-new-tokens", "1"]) == 0
    err = capsys.readouterr().err
    assert "\x1b" not in err and "e\\x1b[31mDIR[bold]x step 5" in err


def test_prompt_and_new_tokens_fit_in_the_runs_seq_len():
    assert [new_token_budget(3, 32, None), new_token_budget(3, 2048, None)] == [29, 64]
    assert new_token_budget(3, 32, 29) == 29
    with pytest.raises(TitanError, match=r"--max-new-tokens 30: .* --seq-len 32 .*at most 29$"):
        new_token_budget(3, 32, 30)
    with pytest.raises(TitanError, match="--prompt: 32 tokens"):
        new_token_budget(32, 32, None)


def test_a_cache_past_the_memory_there_is_refused_before_it_is_made(monkeypatch):
    import titan.generation.generate as generate

    model = resolve_model("d_model=64,n_layers=2,n_heads=4,n_kv_heads=2,ffn_dim=128,vocab_size=512")
    weights = {"w": np.zeros(1000, np.float32)}  # 4,000 bytes
    loaded = LoadedModel(model, weights, jnp.float32, None, Path("r"), 0, 10**6)  # type: ignore[arg-type]
    cache = 2 * 2 * 1000 * 2 * 16 * 4  # 2 (k, v) x layers x positions x KV heads x dim x bytes
    monkeypatch.setattr(generate, "host_memory_bytes", lambda: cache + 4000)
    check_cache_fits(loaded, 1000)  # exactly what there is
    with pytest.raises(TitanError) as refused:
        check_cache_fits(loaded, 1001)
    assert str(refused.value) == (
        "--max-new-tokens: the key/value cache of 1,001 positions takes 513 kB and the weights "
        "4 kB, more than the 516 kB of this host's memory; ask for fewer new tokens"
    )


def test_a_prompt_must_be_utf8_text():
    check_prompt("déf main(")
    with pytest.raises(TitanError, match=r"^--prompt: not UTF-8 text \(byte 2: 0xff\)"):
        check_prompt("é" + os.fsdecode(b"\xff"))  # the offset counts the UTF-8 bytes before it
    with pytest.raises(TitanError, match=r"^--prompt: not UTF-8 text \(U\+D800\)"):
        check_prompt("x\ud800")  # a lone surrogate of no byte
