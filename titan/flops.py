"""Model estimates: parameter counts and training FLOPs per token of Llama-style shapes.

Shapes are :class:`titan.config.ModelConfig` values: the presets shared with
:mod:`titan.models.llama` (``titan.config.PRESETS``) or a custom shape written as
``d_model=4096,n_layers=32,n_heads=32,n_kv_heads=8,ffn_dim=14336,vocab_size=128256``.

FLOPs count a multiply-add as 2 FLOPs. Per token and per decoder layer, the forward pass does
2 x (matmul parameters of the layer) FLOPs in its projections (Kaplan et al. 2020, "Scaling Laws
for Neural Language Models", Sec. 2.1, Table 1) plus 2 x 2 x s x d in attention (q k^T and the
weighted sum of values over s keys, d = n_heads x head_dim). The output head adds 2 x d x V; the
embedding lookup is a gather, not a matmul. The backward pass costs twice the forward (one matmul
for the input gradient and one for the weight gradient per forward matmul), so training costs
3 x forward: 6 N + 12 L s d for attention counted in full (PaLM, Chowdhery et al. 2022,
Appendix B). With a causal mask only half of the score matrix is needed: the ``causal``
convention halves the attention term (as FlashAttention, Dao et al. 2022, counts it); ``full``
keeps it. Both conventions are reported; the FLOPs a kernel *executes* depend on it: a flash
kernel skips masked blocks (causal), a materialized score matrix computes all of it (full).

Recomputation (``--remat``) adds forward work that model FLOPs (and MFU) do not count:
``none`` adds nothing; ``dots`` (JAX ``dots_with_no_batch_dims_saveable``) keeps the projection
outputs and recomputes attention (its matmuls have batch dimensions), so it adds one attention
forward per layer; ``full`` (``nothing_saveable``) recomputes the layer forward (Korthikanti et
al. 2022, "Reducing Activation Recomputation in Large Transformer Models", Sec. 5: one extra
forward pass) except its last projection, whose output no backward step reads
(:attr:`TokenFlops.layer_output`).
"""

from __future__ import annotations

from dataclasses import dataclass

from titan.remat import REMAT_POLICIES
from titan.shapes import ModelConfig

ATTENTION_CONVENTIONS = ("causal", "full")
# How attention is computed: "flash" (a fused kernel, O(s) memory, skips masked blocks) or
# "materialized" (the ``native`` provider of titan.ops: the (s, s) scores exist in memory).
ATTENTION_KERNELS = ("flash", "materialized")


def kv_dim(m: ModelConfig) -> int:
    """Width of the key (and of the value) projection: n_kv_heads x head_dim."""
    return m.n_kv_heads * m.head_dim


def layer_matmul_params(m: ModelConfig) -> int:
    """Matmul parameters of one decoder layer: q and output projections (2 d^2), k and v
    (2 d kv_dim), SwiGLU gate, up and down (3 d ffn_dim)."""
    return 2 * m.d_model * m.d_model + 2 * m.d_model * kv_dim(m) + 3 * m.d_model * m.ffn_dim


@dataclass(frozen=True)
class TokenFlops:
    """Forward FLOPs per token of the parts of a model, as executed.

    Attributes:
        layer_matmul: projections of one decoder layer (2 x its matmul parameters).
        layer_attention: q k^T and probabilities x values of one layer over ``seq_len`` keys
            (halved when ``causal``).
        head: output projection (2 d V).
        layer_output: the part of ``layer_matmul`` in the layer's last projection, whose output
            only enters the residual sum (2 d ffn, Llama's SwiGLU down projection). A backward
            pass never needs that output, so recomputation never redoes it: JAX drops it from
            the recomputed forward as dead code (the compiled step's ``cost_analysis()``,
            ``tests/unit/test_flops.py``). 0 where the output is needed (a DiT gates it).
    """

    layer_matmul: float
    layer_attention: float
    head: float
    layer_output: float = 0.0


def token_flops(m: ModelConfig, seq_len: int, causal: bool) -> TokenFlops:
    """Forward FLOPs per token (see :class:`TokenFlops`); ``causal`` halves attention. A DiT
    (:func:`dit_token_flops`) attends in full under both conventions."""
    if m.family == "dit":
        return dit_token_flops(m)
    attention = 4.0 * seq_len * m.d_model * (0.5 if causal else 1.0)
    head = 2.0 * m.d_model * m.vocab_size
    return TokenFlops(2.0 * layer_matmul_params(m), attention, head, 2.0 * m.d_model * m.ffn_dim)


def dit_token_flops(m: ModelConfig) -> TokenFlops:
    """Forward FLOPs per patch token of Titan's DiT (:mod:`titan.models.dit`), N = its patches:
    per layer the projections and SwiGLU (2 (4 d^2 + 3 d ffn)) plus the adaLN modulation, done
    once per image (2 x 6 d^2 / N), and attention over all N patches (4 N d, no causal mask);
    the ends (as ``head``): the patch embedding and the final linear layer (2 x 2 d P^2 C) plus,
    once per image, the timestep MLP and the final modulation (2 (256 d + d^2 + 2 d^2) / N). The
    label lookup is a gather. FLOPs per image are N times these."""
    d, n, pixels = m.d_model, m.patches, m.patch_size**2 * m.channels
    layer = 2.0 * (4 * d * d + 3 * d * m.ffn_dim) + 2.0 * 6 * d * d / n
    ends = 4.0 * d * pixels + 2.0 * (256 * d + 3 * d * d) / n
    return TokenFlops(layer, 4.0 * n * d, ends)


def model_flops_per_token(m: ModelConfig, seq_len: int, convention: str = "causal") -> float:
    """Training (forward + backward) model FLOPs per token, without recomputation:
    6 N_matmul + 12 L s d (x 1/2 for the ``causal`` convention).

    Raises:
        ValueError: ``convention`` not in :data:`ATTENTION_CONVENTIONS`.
    """
    if convention not in ATTENTION_CONVENTIONS:
        raise ValueError(f"attention convention must be one of {ATTENTION_CONVENTIONS}")
    f = token_flops(m, seq_len, causal=convention == "causal")
    return 3.0 * (m.n_layers * (f.layer_matmul + f.layer_attention) + f.head)


def layer_recompute_flops(f: TokenFlops, remat: str) -> float:
    """Forward FLOPs per token and layer redone in the backward pass under ``remat``
    (``titan.remat.RematPolicy.recomputed``).

    Raises:
        ValueError: unknown remat policy.
    """
    if remat not in REMAT_POLICIES:
        raise ValueError(f"remat must be one of {tuple(REMAT_POLICIES)}, got {remat!r}")
    return REMAT_POLICIES[remat].recomputed(f.layer_matmul, f.layer_attention, f.layer_output)


def hardware_flops_per_token(m: ModelConfig, seq_len: int, remat: str, convention: str) -> float:
    """Training FLOPs per token as executed under ``remat``: model FLOPs plus the recomputed
    forward work of every layer (:func:`layer_recompute_flops`)."""
    recompute = layer_recompute_flops(token_flops(m, seq_len, convention == "causal"), remat)
    return model_flops_per_token(m, seq_len, convention) + m.n_layers * recompute


def training_flops_per_token(
    m: ModelConfig, seq_len: int, remat: str
) -> tuple[dict[str, float], dict[str, float]]:
    """(model, hardware) training FLOPs per token of ``m``, keyed by attention convention."""
    model = {c: model_flops_per_token(m, seq_len, c) for c in ATTENTION_CONVENTIONS}
    hardware = {c: hardware_flops_per_token(m, seq_len, remat, c) for c in ATTENTION_CONVENTIONS}
    return model, hardware
