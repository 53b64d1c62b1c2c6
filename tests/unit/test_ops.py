"""Semantic operators and the provider registry (native provider)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from titan.errors import TitanError
from titan.ops import Ops
from titan.ops.registry import parse_overrides


def _qkv(seed=0, batch=2, seq=8, heads=4, kv=2, dim=16):
    keys = jax.random.split(jax.random.key(seed), 3)
    q = jax.random.normal(keys[0], (batch, seq, heads, dim))
    k = jax.random.normal(keys[1], (batch, seq, kv, dim))
    v = jax.random.normal(keys[2], (batch, seq, kv, dim))
    return q, k, v


def test_attention_matches_the_textbook_formula():
    q, k, v = _qkv()
    out = Ops("cpu").attention(q, k, v)
    k_full, v_full = jnp.repeat(k, 2, axis=2), jnp.repeat(v, 2, axis=2)
    scores = jnp.einsum("bshd,bthd->bhst", q, k_full) / 4.0
    scores = jnp.where(jnp.tril(jnp.ones((8, 8), bool)), scores, -jnp.inf)
    expected = jnp.einsum("bhst,bthd->bshd", jax.nn.softmax(scores, -1), v_full)
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)


def test_packed_documents_do_not_attend_across_segments():
    q, k, v = _qkv()
    segments = jnp.array([[1, 1, 1, 2, 2, 2, 2, 2]] * 2)
    ops = Ops("cpu")
    base = ops.attention(q, k, v, segment_ids=segments)
    v_changed = v.at[:, :3].set(100.0)  # only the first document's values change
    changed = ops.attention(q, k, v_changed, segment_ids=segments)
    np.testing.assert_allclose(base[:, 3:], changed[:, 3:], rtol=1e-6)
    assert not np.allclose(base[:, :3], changed[:, :3])


def test_cross_entropy_is_the_log_softmax_of_the_target():
    x = jax.random.normal(jax.random.key(1), (1, 3, 8))
    w = jax.random.normal(jax.random.key(2), (8, 5))
    targets = jnp.array([[0, 4, 2]])
    nll = Ops("cpu").cross_entropy(x, w, targets)
    logp = jax.nn.log_softmax(x @ w, -1)
    np.testing.assert_allclose(nll[0], -logp[0, jnp.arange(3), targets[0]], rtol=1e-5)


def test_rope_preserves_norm_and_relative_positions():
    ops = Ops("cpu")
    x = jax.random.normal(jax.random.key(3), (1, 4, 1, 8))
    pos = jnp.arange(4)[None]
    rotated = ops.rope(x, pos, theta=10000.0)
    np.testing.assert_allclose(
        jnp.linalg.norm(rotated, axis=-1), jnp.linalg.norm(x, axis=-1), rtol=1e-5
    )
    shifted = ops.rope(x, pos + 5, theta=10000.0)
    dots = jnp.einsum("bsnd,btnd->st", rotated, rotated)
    np.testing.assert_allclose(
        dots, jnp.einsum("bsnd,btnd->st", shifted, shifted), rtol=1e-4, atol=1e-4
    )


def test_registry_records_served_provider_and_rejects_unknown_ones(monkeypatch):
    ops = Ops("cpu", {"attention": "native"})
    ops.rms_norm(jnp.ones((2, 4)), jnp.ones(4), eps=1e-5)
    assert ops.served == {"rms_norm": "native"}
    with pytest.raises(TitanError, match="unknown provider 'cudnn' for op attention"):
        Ops("cpu", {"attention": "cudnn"})
    monkeypatch.setenv("TITAN_OPS", "attenton=native")
    with pytest.raises(TitanError, match="unknown op 'attenton'"):
        Ops("cpu")
    assert parse_overrides("attention=native, rope=native") == {
        "attention": "native",
        "rope": "native",
    }
