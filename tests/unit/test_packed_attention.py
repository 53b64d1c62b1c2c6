"""The packed documents that the cuDNN provider hands cuDNN (``titan.ops.providers.cudnn``):
lengths and offsets that reproduce the document mask exactly, and ``fits`` false whenever they
cannot (a row with more documents than the bound, or ids that are not runs). cuDNN itself runs
on a GPU only (``bench/attention.py`` checks it there against ``native``)."""

import jax.numpy as jnp
import numpy as np
import pytest

from titan.ops.providers import cudnn
from titan.ops.providers.cudnn import packed_documents, segment_bound


def _mask_of(lengths: np.ndarray, offsets: np.ndarray, seq_len: int) -> np.ndarray:
    """The (B, S, S) causal-within-segment mask that cuDNN's packed layout means."""
    rows = []
    for row_lengths, row_offsets in zip(lengths, offsets, strict=False):
        segment = np.full(seq_len, -1)
        for index, (length, offset) in enumerate(zip(row_lengths, row_offsets, strict=False)):
            if length >= 0:
                segment[offset : offset + length] = index
        assert (segment >= 0).all(), "every token is in a segment"
        causal = np.tril(np.ones((seq_len, seq_len), bool))
        rows.append(causal & (segment[:, None] == segment[None, :]))
    return np.stack(rows)


def _document_mask(ids: np.ndarray) -> np.ndarray:
    seq_len = ids.shape[1]
    return np.tril(np.ones((seq_len, seq_len), bool)) & (ids[:, :, None] == ids[:, None, :])


def test_packed_documents_reproduce_the_document_mask():
    rng = np.random.default_rng(0)
    cuts = np.sort(rng.choice(np.arange(1, 64), size=(5, 6)), axis=1)
    ids = np.stack([np.searchsorted(row, np.arange(64), side="right") for row in cuts]) + 7
    lengths, offsets, fits = packed_documents(jnp.asarray(ids), bound=8)
    assert bool(fits)
    assert np.array_equal(
        _mask_of(np.asarray(lengths), np.asarray(offsets), 64), _document_mask(ids)
    )
    assert np.asarray(offsets)[:, -1].tolist() == [-1] * 5  # JAX's (B, bound + 1) form


def test_unused_slots_are_minus_one_and_a_one_document_row_has_one_segment():
    ids = jnp.array([[4, 4, 4, 4, 4, 4], [0, 0, 1, 1, 1, 2]])
    lengths, offsets, fits = packed_documents(ids, bound=4)
    assert np.asarray(lengths).tolist() == [[6, -1, -1, -1], [2, 3, 1, -1]]
    assert np.asarray(offsets).tolist() == [[0, -1, -1, -1, -1], [0, 2, 5, -1, -1]]
    assert bool(fits)


@pytest.mark.parametrize(
    "ids",
    [
        [[0, 1, 2, 3, 4, 5, 6, 7]],  # 8 documents in a row, bound 4
        [[0, 0, 1, 1, 0, 0, 2, 2]],  # id 0 twice: runs are not documents
    ],
)
def test_rows_the_packed_form_cannot_hold_do_not_fit(ids):
    _, _, fits = packed_documents(jnp.asarray(ids), bound=4)
    assert not bool(fits)


def test_segment_bound_grows_with_the_row_within_its_clip():
    assert [segment_bound(s) for s in (128, 2048, 4096, 8192, 131072)] == [4, 16, 32, 64, 64]


def test_grouped_heads_pack_only_under_a_jax_that_strides_them_right(monkeypatch):
    q, kv = jnp.zeros((1, 256, 8, 64)), jnp.zeros((1, 256, 2, 64))
    monkeypatch.setattr(cudnn, "cuda_capability", lambda: (9, 0))
    monkeypatch.setattr(cudnn, "_jax_version", lambda: (0, 10, 2))
    assert not cudnn.packs(q, kv, causal=True)  # 0.10.2 strides keys by the query heads
    assert cudnn.packs(q, q, causal=True)  # as many key/value heads as query heads: no stride
    monkeypatch.setattr(cudnn, "_jax_version", lambda: (0, 11, 2))
    assert cudnn.packs(q, kv, causal=True)
    assert not cudnn.packs(q, kv, causal=False)
    monkeypatch.setattr(cudnn, "cuda_capability", lambda: (8, 0))
    assert not cudnn.packs(q, kv, causal=True)  # before Hopper: the dense mask
