"""Semantic operators: the only compute primitives the Llama model is written against.

Each operator is a method of :class:`Ops`, which dispatches to a provider through the registry
(:mod:`titan.ops.registry`) at trace time. Providers registered here: ``native`` (plain JAX,
:mod:`titan.ops.native`, the reference every other provider is checked against by
:mod:`titan.ops.conformance`); the accelerator providers of :mod:`titan.ops.providers` register
on import of this package (their table says what each one serves).

Shapes use B = batch, S = sequence, H = query heads, K = key/value heads, D = head dim,
E = model dim, F = MLP hidden dim, V = vocabulary; for images (H, W, C) = height, width,
channels and P = patch side.

Importing this package imports no JAX: implementations are registered by name and imported when
first called, so the ``titan`` CLI (whose ``ops`` subcommand is :mod:`titan.commands.ops`)
starts quickly.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from titan.errors import TitanError
from titan.ops import providers, registry  # noqa: F401  (importing providers registers them)
from titan.ops.registry import OPS, OpTable

if TYPE_CHECKING:  # titan.ops.linear imports JAX
    from titan.ops.linear import Linear

__all__ = ["OPS", "Ops"]

for _op in OPS:
    registry.register(_op, registry.NATIVE, f"titan.ops.native:{_op}", priority=0)


class Ops:
    """The semantic operators for one backend, with per-op provider overrides.

    Args:
        backend: ``jax.default_backend()`` of the devices that run the model.
        overrides: op name -> provider name (forced; error if that provider cannot serve), on
            top of those of ``TITAN_OPS`` (e.g. ``attention=pallas,cross_entropy=chunked``).
        from_env: read ``TITAN_OPS``.

    Attributes:
        served: op name -> provider that served it in the last trace (for ``run_start``).

    Raises:
        TitanError: an override names an unknown op or provider, or one not built for
            ``backend``.
    """

    def __init__(
        self, backend: str, overrides: Mapping[str, str] | None = None, *, from_env: bool = True
    ) -> None:
        self._table = OpTable(backend, dict(overrides or {}), from_env=from_env)

    @property
    def backend(self) -> str:
        """The ``jax.default_backend()`` name these ops run on."""
        return self._table.backend

    @property
    def served(self) -> dict[str, str]:
        return dict(self._table.served)

    def unused_overrides(self) -> dict[str, str]:
        """The forced providers (overrides, ``TITAN_OPS``) of the ops that no trace so far
        called (op name -> provider name): a model that calls no ``modulate`` ignores
        ``modulate=pallas``, and a MaxText model calls none of these ops."""
        forced = self._table.overrides.items()
        return {op: name for op, name in forced if op not in self._table.served}

    def unforced(self) -> Ops:
        """These ops with no overrides (``TITAN_OPS`` ignored too): the registry chooses every
        provider. For traces whose results are thrown away, such as the float32 forward that
        flax runs to create parameters, where a provider forced for the bf16 train step
        (``attention=cudnn``, bf16/fp16 only) would rightly refuse float32 inputs."""
        return Ops(self.backend, from_env=False)

    def attention(self, q, k, v, *, segment_ids=None, causal=True, sliding_window=None):
        """Scaled dot-product attention with grouped-query heads (Vaswani et al. 2017, Sec. 3.2;
        GQA: Ainslie et al. 2023).

        Args:
            q: (B, S, H, D) queries; k, v: (B, S, K, D) with H a multiple of K.
            segment_ids: optional (B, S) int32; tokens attend only within the same segment
                (packed documents do not see each other).
            causal: position i attends to positions <= i.
            sliding_window: optional int W; position i attends to positions > i - W.

        Returns:
            (B, S, H, D) in q's dtype; softmax(q k^T / sqrt(D)) v, computed in float32.
        """
        return self._table.call(
            "attention",
            q,
            k,
            v,
            segment_ids=segment_ids,
            causal=causal,
            sliding_window=sliding_window,
        )

    def rms_norm(self, x, scale, *, eps):
        """RMSNorm (Zhang & Sennrich 2019): x / sqrt(mean(x^2) + eps) * scale.

        Args:
            x: (..., E) any float dtype; scale: (E,). Returns x's shape and dtype (float32 math).
        """
        return self._table.call("rms_norm", x, scale, eps=eps)

    def rope(self, x, positions, *, theta, scaling=None):
        """Rotary position embedding (Su et al. 2021, Eq. 34), rotate-half layout: the first and
        second halves of the head dim form the (real, imaginary) pairs, frequency
        theta^(-2i/D) for pair i, scaled as Llama 3.1 does when ``scaling`` is given
        (:func:`titan.ops.native.rope_inv_freq`). Every provider of ``rope`` takes ``scaling``.

        Args:
            x: (B, S, N, D) with D even; positions: (B, S) integer positions;
            scaling: a :class:`titan.shapes.RopeScaling` or None.
        Returns:
            (B, S, N, D) in x's dtype.

        Raises:
            TitanError: D is odd.
        """
        if x.shape[-1] % 2:
            raise TitanError(f"rope needs an even head dim, got {x.shape[-1]}")
        return self._table.call("rope", x, positions, theta=theta, scaling=scaling)

    def swiglu(self, x, w_gate, w_up, w_down, *, linear: Linear | None = None):
        """SwiGLU MLP (Shazeer 2020, Eq. 6): (silu(x W_gate) * (x W_up)) W_down.

        Args:
            x: (B, S, E); w_gate, w_up: (E, F); w_down: (F, E), all in the compute dtype.
            linear: how the three matmuls compute (:class:`titan.ops.linear.Linear`: FP8,
                gate and up fused into one GEMM; None: ``Linear()``, the compute dtype, one
                GEMM each); every provider takes it.
        Returns:
            (B, S, E) in x's dtype, matmuls accumulated in float32.
        """
        return self._table.call("swiglu", x, w_gate, w_up, w_down, linear=linear)

    def cross_entropy(self, x, w_out, targets):
        """Output head plus token-level cross-entropy: -log softmax(x W_out)[target].

        Args:
            x: (B, S, E) final hidden states; w_out: (E, V); targets: (B, S) int32 in [0, V).
        Returns:
            (B, S) float32 negative log-likelihoods (natural log, nats).
        """
        return self._table.call("cross_entropy", x, w_out, targets)

    def modulate(self, x, shift, scale):
        """adaLN modulation (DiT, Peebles & Xie 2023, Sec. 3.2): x * (1 + scale) + shift, with
        one (shift, scale) per row broadcast over the sequence.

        Args:
            x: (B, S, E); shift, scale: (B, E). Returns x's shape and dtype (float32 math).
        """
        return self._table.call("modulate", x, shift, scale)

    def patch_embed(self, images, w, bias, *, patch):
        """Patch embedding (ViT, Dosovitskiy et al. 2021, Eq. 1; DiT's "patchify" layer):
        non-overlapping P x P patches in row-major order, each projected linearly.

        Args:
            images: (B, H, W, C) with H and W multiples of ``patch``; w: (P, P, C, E);
                bias: (E,).
        Returns:
            (B, H/P * W/P, E) in images' dtype, accumulated in float32.

        Raises:
            TitanError: H or W is not a multiple of ``patch``.
        """
        if images.shape[1] % patch or images.shape[2] % patch:
            raise TitanError(
                f"patch_embed: image {images.shape[1]}x{images.shape[2]} is not a multiple of "
                f"the patch size {patch}"
            )
        return self._table.call("patch_embed", images, w, bias, patch=patch)
