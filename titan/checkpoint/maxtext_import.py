"""``titan import maxtext``: a MaxText llama2-block params checkpoint as a Titan Llama checkpoint.

The parameters are converted by :func:`titan.models.adapters.maxtext_checkpoints.maxtext_to_llama`
(names, the layer axis, the query scaling) and written as ``titan import hf`` writes its output
(:func:`titan.checkpoint.hf_checkpoints.write_llama_checkpoint`): ``config.json``,
``tokenizer.model`` and the checkpoint at step 0, which ``titan train --init-from``, ``titan
export hf`` and ``titan generate`` read. A MaxText checkpoint holds no tokenizer (MaxText's
config names one, ``tokenizer_path``), so the command is given it.
"""

from __future__ import annotations

from pathlib import Path

from titan.checkpoint.hf_checkpoints import write_llama_checkpoint
from titan.data.tokenizer import load_tokenizer
from titan.errors import TitanError
from titan.models.adapters.maxtext_checkpoints import (
    DEFAULT_NORM_EPS,
    DEFAULT_ROPE_THETA,
    llama_shape,
    maxtext_to_llama,
    read_maxtext_params,
)
from titan.out_paths import check_new_dir
from titan.shapes import (
    NORM_EPS_RULE,
    ROPE_THETA_RULE,
    ModelConfig,
    norm_eps_ok,
    rope_theta_ok,
)

WHAT = "titan import maxtext"


def import_maxtext(
    path: Path,
    out: Path,
    tokenizer: Path,
    rope_theta: float = DEFAULT_ROPE_THETA,
    norm_eps: float = DEFAULT_NORM_EPS,
) -> ModelConfig:
    """Write ``out``: the Titan Llama checkpoint at step 0 of the MaxText params checkpoint at
    ``path``, with the tokenizer file ``tokenizer`` (any kind :func:`load_tokenizer` reads).

    Returns:
        The model shape (``out/config.json``'s ``model``).

    Raises:
        TitanError: ``rope_theta`` or ``norm_eps`` is no model's (:func:`titan.shapes.check_shape`
            holds them to its rules), ``out`` exists or cannot be
            made, ``path`` is not a llama2-block checkpoint or has a shape Titan's Llama cannot
            take, or the tokenizer does not load or has more tokens than the embedding.
    """
    if not rope_theta_ok(rope_theta):
        raise TitanError(f"--rope-theta {rope_theta}: must be {ROPE_THETA_RULE}")
    if not norm_eps_ok(norm_eps):
        raise TitanError(f"--norm-eps {norm_eps}: must be {NORM_EPS_RULE}")
    check_new_dir(out)  # before the read: a bad --out fails at once
    loaded = load_tokenizer(tokenizer)
    params = maxtext_to_llama(read_maxtext_params(path), str(path))
    shape = llama_shape(params, rope_theta, norm_eps)
    if loaded.vocab_size > shape.vocab_size:
        raise TitanError(
            f"--tokenizer {tokenizer}: {loaded.vocab_size} tokens, more than the checkpoint's "
            f"{shape.vocab_size} embedding rows"
        )
    source = {"source": str(Path(path).absolute()), "tokenizer": str(Path(tokenizer).absolute())}
    write_llama_checkpoint(out, shape, params, loaded, {"maxtext_import": source}, WHAT)
    return shape
