"""The next token from the logits: greedy, or temperature with nucleus (top-p) sampling."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def sample(
    logits: jax.Array, key: jax.Array, temperature: jax.Array, top_p: jax.Array, vocab: int
) -> jax.Array:
    """One token per row of ``logits``.

    Temperature 0 is greedy (the argmax). Otherwise the logits, less their maximum (which
    changes no probability; a temperature of 1e-30 then draws the argmax), are divided by the
    temperature and the token drawn from the nucleus: the most probable tokens whose
    probabilities, taken in decreasing order, reach ``top_p`` before the last one is added
    (Holtzman et al. 2020, "The Curious Case of Neural Text Degeneration", Sec. 3.1; ``top_p``
    1 keeps every token).
    Tokens tied with the least probable one kept are kept too.

    Args:
        logits: (B, V) float32; key: a PRNG key; temperature, top_p: float32 scalars (traced,
            so changing them compiles nothing), top_p in (0, 1].
        vocab: ids >= ``vocab`` are never drawn (rows of an embedding wider than the
            tokenizer's vocabulary).

    Returns:
        (B,) int32 token ids.
    """
    ids = jnp.arange(logits.shape[-1])
    logits = jnp.where(ids < vocab, logits, -jnp.inf)
    greedy = jnp.argmax(logits, axis=-1)
    # shifted first, so that the largest is 0 and a tiny temperature makes the others -inf or
    # huge negatives, never huge positives (whose softmax is NaN under jit)
    shifted = logits - jnp.max(logits, axis=-1, keepdims=True)
    scaled = shifted / jnp.where(temperature > 0, temperature, 1.0)
    probs = jax.nn.softmax(scaled, axis=-1)
    descending = -jnp.sort(-probs, axis=-1)
    before = jnp.cumsum(descending, axis=-1) - descending  # mass of the more probable tokens
    kept = jnp.where(before < top_p, descending, jnp.inf)
    floor = jnp.min(kept, axis=-1, keepdims=True)  # the least probable token of the nucleus
    nucleus = jnp.where(probs >= floor, scaled, -jnp.inf)
    drawn = jax.random.categorical(key, nucleus, axis=-1)
    return jnp.where(temperature > 0, drawn, greedy).astype(jnp.int32)
