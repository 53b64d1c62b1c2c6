"""Activation recomputation (``--remat``) policies, registered once with everything known about
them: the JAX checkpoint policy the model runs under, what a decoder layer saves for the
backward pass (bytes per token, as the planner counts them) and the forward work it redoes.

``titan.models.llama`` wraps each block in ``nn.remat`` with :meth:`RematPolicy.jax_policy`;
``titan.planning.memory`` and ``titan.flops`` price :attr:`RematPolicy.saved` and
:attr:`RematPolicy.recomputed`; ``titan.config`` takes the names as ``--remat`` choices. The JAX
policy is resolved lazily (JAX is imported when a model is built, not when the config is), so
the console and the planner import this module without JAX.

Saved bytes per token and layer (``titan.planning.memory`` explains the terms and sources), with
``p`` the compute-dtype bytes and d, kv, f, h, s the model width, key/value width, MLP width,
heads and sequence length; each is (replicated over TP, sharded by TP):

- ``none``: ((16 + 2p) d + 16, 2p d + 2p kv + mlp + scores), scores (4 + p) h s + 8 h for
  a materialized attention, 4 h for flash; mlp (20 + p) f for the native SwiGLU (its float32
  gate, up, sigmoid and products, and the compute-dtype product), 3p f for the fused one
  (``pallas``: its custom VJP keeps only the gate and up projections and their product);
- ``dots`` (``dots_with_no_batch_dims_saveable``): the layer input and the attention output 2p d;
  queries p d, keys and values 2p kv, gate and up projections 2p f. Attention is recomputed;
- ``dots-attention``: ``dots`` plus the fused attention kernel's output p d and its float32
  log-sum-exp 4 h (AXLearn's flash-attention remat policy saves the same); with a
  materialized attention there is no fused kernel, and it saves what ``dots`` saves;
- ``full`` (``nothing_saveable``): the layer input p d; the layer forward is recomputed
  (Korthikanti et al. 2022, Sec. 5: one extra forward pass) but for its last projection, whose
  output no backward step reads.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

# Primitives of the fused attention kernels: cuDNN's forward (behind
# ``jax.nn.dot_product_attention``) and Pallas kernels (titan.ops.providers).
FUSED_ATTENTION_PRIMITIVES = ("dot_product_attention_fwd_wrapper", "pallas_call")


def save_dots_and_fused_attention(prim: Any, *args: Any, **params: Any) -> bool:
    """Remat policy ``dots-attention``: what ``dots`` saves (matmul outputs without batch
    dimensions) plus the outputs of fused attention kernels (output and softmax statistics),
    so the backward pass does not rerun the attention forward."""
    import jax

    if prim.name in FUSED_ATTENTION_PRIMITIVES:
        return True
    return jax.checkpoint_policies.dots_with_no_batch_dims_saveable(prim, *args, **params)


def _dots_policy() -> Callable[..., bool]:
    import jax

    return jax.checkpoint_policies.dots_with_no_batch_dims_saveable


def _nothing_policy() -> Callable[..., bool]:
    import jax

    return jax.checkpoint_policies.nothing_saveable


def _saved_none(
    p: int, d: int, kv: int, f: int, h: int, s: int, attention: str, swiglu: str = "native"
) -> tuple[float, float]:
    scores = (4 + p) * h * s + 8 * h if attention == "materialized" else 4 * h
    mlp = 3 * p * f if swiglu == "fused" else (20 + p) * f
    return (16 + 2 * p) * d + 16, 2 * p * d + 2 * p * kv + mlp + scores


class Recomputed(Protocol):
    """:attr:`RematPolicy.recomputed`: the forward FLOPs per token that the backward pass redoes,
    of a layer's matmul, attention and output projection FLOPs per token."""

    def __call__(self, matmul: float, attention: float, output: float = 0.0) -> float: ...


@dataclass(frozen=True)
class RematPolicy:
    """One ``--remat`` policy.

    Attributes:
        name: the ``--remat`` value.
        resolve: () -> the JAX checkpoint policy (imports JAX); None: no recomputation.
        saved: (p, d, kv, f, h, s, attention, swiglu) -> (replicated, sharded) bytes per token
            that one layer keeps for the backward pass (module docstring); ``swiglu`` is
            ``fused`` or ``native``.
        recomputed: (layer matmul FLOPs, layer attention FLOPs, FLOPs of the layer's output
            projection) per token -> the forward FLOPs redone in the backward pass (the
            output projection is never redone: ``titan.flops.TokenFlops``).
    """

    name: str
    resolve: Callable[[], Callable[..., bool]] | None
    saved: Callable[..., tuple[float, float]]
    recomputed: Recomputed

    def jax_policy(self) -> Callable[..., bool] | None:
        """The policy for ``jax.checkpoint`` / ``nn.remat``; None when nothing is recomputed."""
        return None if self.resolve is None else self.resolve()


REMAT_POLICIES: dict[str, RematPolicy] = {
    policy.name: policy
    for policy in (
        RematPolicy("none", None, _saved_none, lambda matmul, attention, output=0.0: 0.0),
        RematPolicy(
            "dots",
            _dots_policy,
            lambda p, d, kv, f, h, s, a, swiglu="native": (
                2 * p * d,
                p * d + 2 * p * kv + 2 * p * f,
            ),
            lambda matmul, attention, output=0.0: attention,
        ),
        RematPolicy(
            "dots-attention",
            lambda: save_dots_and_fused_attention,
            lambda p, d, kv, f, h, s, a, swiglu="native": (
                2 * p * d,
                p * d + 2 * p * kv + 2 * p * f + (p * d + 4 * h if a == "flash" else 0),
            ),
            lambda matmul, attention, output=0.0: 0.0,
        ),
        RematPolicy(
            "full",
            _nothing_policy,
            lambda p, d, kv, f, h, s, a, swiglu="native": (p * d, 0.0),
            lambda matmul, attention, output=0.0: matmul - output + attention,
        ),
    )
}


AUTO = "auto"  # --remat auto: resolved per run by titan.layouts.memory_check.resolve_remat


def auto_candidates(platform: str) -> tuple[str, ...]:
    """The policies ``--remat auto`` tries, fastest first, for a device ``platform``
    (``jax.Device.platform``: ``cpu``, ``gpu``, ``tpu``, ...).

    On accelerators: ``dots-attention``, then ``dots``, then ``full``. Measured on an H200
    (``bench/results/mfu-nvidia-h200-remat.json``, a 0.886B Llama at 8 x 2048 tokens under the
    document mask): ``dots-attention`` 85.5k tokens/s, ``dots`` 83.1k, ``none`` 75.3k, ``full``
    74.0k. Saving every activation (``none``) is slower than saving the matmul outputs and
    recomputing the elementwise work from them, which costs fewer bytes of HBM traffic than
    storing and reading back the float32 intermediates, so ``none`` is never chosen
    automatically on GPUs. On the CPU memory is the host's and compute the bottleneck: ``none``.

    On a TPU, ``none`` first: XLA:TPU rematerializes on its own whatever does not fit the HBM
    (:func:`titan.layouts.memory_check.compiler_fits`), so saving everything leaves the choice
    of what to recompute to the compiler, which knows the chip. Measured on one TPU v5e with
    native attention (``bench/results/tpu-v5e-native-attention``, a 0.32B Llama at 8 x 2048
    tokens): ``none`` 49.7k tokens/s against ``dots-attention`` 45.5k.
    """
    if platform == "cpu":
        return ("none",)
    if platform == "tpu":
        return ("none", "dots-attention", "dots", "full")
    return ("dots-attention", "dots", "full")


def effective_policy(name: str, attention: str) -> str:
    """The policy that ``name`` acts as with an ``attention`` kernel (``flash`` or
    ``materialized``): ``dots-attention`` saves the outputs of fused attention kernels, so with a
    materialized attention (no such kernel) it saves and recomputes what ``dots`` does."""
    return "dots" if name == "dots-attention" and attention == "materialized" else name
