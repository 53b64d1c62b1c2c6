"""``titan train --init-from``: the options a run takes from the checkpoint it starts from."""

from __future__ import annotations

from titan.cli import main
from titan.shapes import DEFAULT_VOCAB_SIZE
from titan.trainer.init_from import saved_model


def test_a_vocab_size_other_than_the_checkpoints_is_refused_naming_both(
    finished_run, tmp_path, capsys
):
    _, model = saved_model(finished_run, "--init-from")
    assert model.vocab_size not in (1000, DEFAULT_VOCAB_SIZE)
    start = ["train", "--init-from", str(finished_run)]
    assert main([*start, "--vocab-size", "1000", "--print-config"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line == (
        f"titan train: error: --vocab-size 1000 conflicts with --init-from {finished_run}, whose "
        f"model has a vocabulary of {model.vocab_size} (the run keeps it); leave --vocab-size out"
    )
    assert main([*start, "--vocab-size", str(model.vocab_size), "--print-config"]) == 0
    capsys.readouterr()
    # the config --print-config writes holds the default --vocab-size: it reads back
    assert main([*start, "--print-config"]) == 0
    printed = capsys.readouterr().out
    assert f"vocab_size = {DEFAULT_VOCAB_SIZE}\n" in printed
    (tmp_path / "printed.toml").write_text(printed)
    assert main(["train", "--config", str(tmp_path / "printed.toml"), "--print-config"]) == 0
    assert capsys.readouterr().out == printed
