"""MaxText's decoders (``maxtext`` 0.2.5, pure NNX) behind the model seam.

A MaxText model is named as MaxText names it (``llama2-7b``, ``mistral-7b``, ``gemma2-2b``,
``qwen3-0.6b``, ``mixtral-8x7b``; a yml of ``maxtext/configs/models/``) with ``key=value``
overrides of its config (``base_emb_dim=256``), and built by MaxText's own
``pyconfig.initialize`` (``base.yml``, then the model's yml, then the overrides) and
``maxtext.models.models.Transformer``. Titan sets the keys that its own options own (sequence
length, dtypes, remat, vocabulary, the mesh and its rules) and turns off what a library must not
leave behind (JAX's persistent compilation cache in ``~/jax_cache``, MaxText's checkpointing and
its ``jax.distributed`` start-up).

Chunks: chunk c is a ``Transformer`` built with only its layers (``base_num_decoder_layers`` =
the chunk's layers); its parameters are the model's with the layer axis (axis 1, MaxText's
``param_scan_axis``) cut at the chunk's bounds, the token embedding on the first chunk, the final
norm and output head on the last. A chunk other than the first takes the previous chunk's
un-normalised hidden state through ``decoder_input_embeddings``; a chunk other than the last
returns its hidden state (its head's logits are dead code that XLA removes). A "layer" is one
entry of MaxText's scanned stack: for ``gemma2`` that is a (local, global) pair of decoder
layers, as in MaxText's own yml.

Sharding: every MaxText logical axis name is mapped onto one of Titan's logical names
(:data:`AXIS_NAMES`), which :mod:`titan.parallel.sharding` maps onto the (data, fsdp, tensor)
mesh; parameters are recorded with Titan's names, and the model's activation constraints resolve
through the same table. A name missing from the table is a one-line error naming it.

Refused in one line (:func:`check_supported`): quantisation (AQT, qwix, fp8), multi-head latent
attention (MLA), multi-token prediction, multimodal encoders, MaxText's own pipeline, vocabulary
tiling, families that carry non-parameter state between steps (deepseek's MoE routing bias), and
tied embeddings (``logits_via_embedding``) cut across pipeline stages.

``maxtext`` is imported here only, inside functions: Titan imports without it (it installs on
Python 3.12+ only; ``pip install 'titan-jax[maxtext]'``).
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from titan.errors import TitanError
from titan.flops import ATTENTION_CONVENTIONS
from titan.models.adapters import maxtext_errors
from titan.models.adapters.base import (
    LossAndTerms,
    ModelAdapter,
    PyTree,
    StageInputs,
    next_token_batch,
    next_token_inputs,
)
from titan.parallel.chunks import Chunk, whole_model
from titan.parallel.sharding import ACTIVATION_RULES, LOGICAL_RULES, MESH_AXES
from titan.remat import REMAT_POLICIES
from titan.shapes import ModelConfig

MAXTEXT_VERSION = "0.2.5"  # the version tested; pyproject's [maxtext] extra pins it

# MaxText decoder_block -> the family Titan records; the families tested here.
FAMILIES = {
    "llama2": "llama",  # llama2 and llama3 share MaxText's llama2 block
    "mistral": "mistral",
    "gemma2": "gemma2",
    "qwen3": "qwen3",
    "mixtral": "mixtral",
}

# MaxText's logical axis names (every rule of maxtext/configs/base.yml and every name its layers'
# parameters use) -> Titan's logical names (titan.parallel.sharding: parameter names of
# LOGICAL_RULES, activation names of ACTIVATION_RULES) or None (replicated).
AXIS_NAMES: Mapping[str, str | None] = {
    # parameters
    "vocab": "vocab",
    "embed_vocab": "embed",
    "embed": "embed",
    "embed_attn": "embed",
    "embed_moe": "embed",
    "embed_router": "embed",
    "q_lora": "embed",
    "kv_lora": "embed",
    "heads": "heads",
    "q_heads": "heads",
    "kv_heads": "kv_heads",
    "mlp": "mlp",
    "mlp_moe": "mlp",
    "mlp_no_fsdp": "mlp",
    "gdn_head": "mlp",
    "qkv": "head_dim",
    "kv": "head_dim",
    "kv_head_dim": "head_dim",
    "q_lora_up_proj": None,
    "kv_lora_up_proj": None,
    "norm": "norm",
    "layers": "layers",
    "dense_layers": "layers",
    "moe_layers": "layers",
    "local_layers": "layers",
    "exp": None,  # Titan's mesh has no expert axis: experts are replicated over it
    "exp_with_fsdp": None,
    "engram_dim": None,
    "mhc": None,
    "diloco": None,
    "circular_repeats": None,
    # activations: the batch over data x fsdp, heads and MLP over tensor, the rest replicated
    "activation_batch": "activation_batch",
    "activation_batch_attn": "activation_batch",
    "activation_batch_moe": "activation_batch",
    "activation_kv_batch": "activation_batch",
    "activation_embed_and_logits_batch": "activation_batch",
    "activation_embed_and_logits_batch_sequence": "activation_batch",
    "activation_prefill_kv_batch": "activation_batch",
    "segment_ids_batch": "activation_batch",
    "decode_batch": "activation_batch",
    "activation_length": "activation_length",
    "activation_length_attn": "activation_length",
    "activation_input_length_attn": "activation_length",
    "activation_q_length": "activation_length",
    "activation_kv_length": "activation_length",
    "activation_norm_length": "activation_length",
    "activation_length_moe": "activation_length",
    "activation_norm_length_moe": "activation_length",
    "prefill_activation_length": "activation_length",
    "prefill_activation_norm_length": "activation_length",
    "decode_length": "activation_length",
    "activation_embed": "activation_embed",
    "activation_embed_attn": "activation_embed",
    "activation_embed_moe": "activation_embed",
    "activation_heads": "heads",
    "activation_kv_heads": "kv_heads",
    "activation_kv": "head_dim",
    "activation_kv_head_dim": "head_dim",
    "activation_mlp": "mlp",
    "activation_mlp_moe": "mlp",
    "activation_vocab": "vocab",
    "activation_exp": None,
    "activation_stage": None,
    # inference caches (not trained here)
    "cache_heads": None,
    "paged_kv_heads": None,
    "cache_batch_prefill": None,
    "cache_batch": None,
    "cache_heads_none": None,
    "cache_kv": None,
    "cache_sequence": None,
    "num_pages": None,
    "tokens_per_page": None,
    "paged_kv_head_dim_size": None,
}

# Keys Titan sets from its own options (the option named): --maxtext-set refuses them.
OWNED_KEYS = {
    "max_target_length": "--seq-len",
    "dtype": "--compute-dtype",
    "weight_dtype": "--param-dtype",
    "remat_policy": "--remat",
    "mesh_axes": "--dp/--fsdp/--tp",
    "logical_axis_rules": "--dp/--fsdp/--tp",
    "data_sharding": "--dp/--fsdp/--tp",
    "jax_cache_dir": "Titan (no persistent compilation cache)",
}
# MaxText's remat policy for each --remat. MaxText always wraps its scanned layers in
# jax.checkpoint; "none" is served by minimal_with_context, which saves every projection and the
# attention output (only elementwise work is redone).
REMAT_TO_MAXTEXT = {
    "none": "minimal_with_context",
    "dots": "minimal",
    "dots-attention": "minimal_with_context",
    "full": "full",
}


def maxtext_available() -> bool:
    """Whether the ``maxtext`` package can be imported (Python 3.12+, the ``[maxtext]`` extra)."""
    return importlib.util.find_spec("maxtext") is not None


def _import(module: str) -> Any:
    """A maxtext module. Raises TitanError when maxtext is not installed."""
    if not maxtext_available():
        raise TitanError(
            "--model-source maxtext needs the maxtext package (Python 3.12+): "
            "pip install 'titan-jax[maxtext]'"
        )
    with maxtext_errors.quiet():  # transformers' and MaxText's import-time advisories
        return importlib.import_module(module)


def titan_axis(name: str) -> str | None:
    """Titan's logical name for MaxText's logical axis ``name``.

    Raises:
        TitanError: ``name`` is not in :data:`AXIS_NAMES` (names it).
    """
    if name not in AXIS_NAMES:
        raise TitanError(
            f"MaxText logical axis '{name}' has no rule in titan.models.adapters.maxtext.AXIS_NAMES"
        )
    return AXIS_NAMES[name]


def _mesh_axes(titan_name: str | None) -> tuple[str, ...]:
    if titan_name is None:
        return ()
    axes: str | tuple[str, ...] | None
    axes = LOGICAL_RULES[titan_name] if titan_name in LOGICAL_RULES else None
    if titan_name in ACTIVATION_RULES:
        axes = ACTIVATION_RULES[titan_name]
    if axes is None:
        return ()
    return (axes,) if isinstance(axes, str) else tuple(axes)


def mesh_rules() -> list[tuple[str, tuple[str, ...]]]:
    """MaxText's logical axis rules onto Titan's (data, fsdp, tensor) mesh: every name of
    :data:`AXIS_NAMES` to the mesh axes of its Titan name (the config's ``logical_axis_rules``
    and the flax rule context of the forward pass)."""
    return [(name, _mesh_axes(titan)) for name, titan in AXIS_NAMES.items()]


def parse_settings(items: Mapping[str, Any]) -> dict[str, Any]:
    """``--maxtext-set`` entries, with values parsed as MaxText's command line parses them
    (YAML scalars and lists: ``8``, ``1e-5``, ``true``, ``[silu,linear]``).

    Raises:
        TitanError: a key Titan sets from its own options (names the option).
    """
    yaml = importlib.import_module("yaml")
    parsed = {}
    for key, value in items.items():
        if key in OWNED_KEYS:
            raise TitanError(f"--maxtext-set {key}: set by {OWNED_KEYS[key]}, not here")
        parsed[key] = yaml.safe_load(value) if isinstance(value, str) else value
    return parsed


@dataclass(frozen=True)
class MaxTextModel:
    """What names a MaxText model of a run.

    Attributes:
        name: MaxText's model name (a yml of ``maxtext/configs/models``).
        settings: config overrides (``--maxtext-set``) as (key, value text) pairs.
        seq_len: tokens per sequence.
        vocab_size: the embedding's rows (the tokenizer's size, unless ``settings`` sets it).
        remat: Titan's ``--remat`` (:data:`REMAT_TO_MAXTEXT`).
        param_dtype: master weights' dtype.
    """

    name: str
    settings: tuple[tuple[str, str], ...] = ()
    seq_len: int = 128
    vocab_size: int = 0
    remat: str = "none"
    param_dtype: str = "float32"

    def config_keys(
        self, n_layers: int | None, dtype: str, tensor_sharded: bool = False
    ) -> dict[str, Any]:
        """The keys given to ``pyconfig.initialize``: Titan's, then the run's settings.

        ``tensor_sharded`` (the mesh's tensor axis has more than one device) turns MaxText's
        sparse MoE matmul off (``sparse_matmul=false``: the dense einsums, exact with the
        default ``capacity_factor=-1``): its ``shard_map`` scatters the expert output's embed
        axis over the tensor axis, which it expects MaxText's own rule ``activation_embed:
        tensor`` to carry out of the map, while Titan keeps activations' embed replicated."""
        keys: dict[str, Any] = {
            "model_name": self.name,
            "override_model_config": True,
            "run_name": "titan",
            "base_output_directory": os.devnull,
            "jax_cache_dir": "",  # no persistent compilation cache in ~/jax_cache
            "enable_checkpointing": False,
            "skip_jax_distributed_system": True,
            "hardware": "gpu" if jax.default_backend() == "gpu" else "cpu",
            "attention": "dot_product",
            "megablox": False,
            "max_target_length": self.seq_len,
            "per_device_batch_size": 1,
            "dtype": dtype,
            "weight_dtype": self.param_dtype,
            "remat_policy": REMAT_TO_MAXTEXT[self.remat],
            "mesh_axes": list(MESH_AXES),
            "data_sharding": [list(MESH_AXES)],
            "logical_axis_rules": [[name, list(axes)] for name, axes in mesh_rules()],
            "enable_dropout": False,
        }
        if self.vocab_size:
            keys["vocab_size"] = self.vocab_size
        keys.update(parse_settings(dict(self.settings)))
        if n_layers is not None:
            keys["base_num_decoder_layers"] = n_layers
        if tensor_sharded:
            keys["sparse_matmul"] = False
        return keys


@functools.cache
def load_config(
    model: MaxTextModel,
    n_layers: int | None = None,
    dtype: str = "float32",
    tensor_sharded: bool = False,
) -> Any:
    """MaxText's config of ``model`` with ``n_layers`` scanned layers (None: the model's own),
    for a mesh whose tensor axis is sharded or not (:meth:`MaxTextModel.config_keys`), built
    with MaxText's logging quiet (:func:`maxtext_errors.quiet`).

    Raises:
        TitanError: not one of MaxText's models, a key MaxText does not know, MaxText rejects a
            setting (names it), a shape it cannot build (:func:`maxtext_errors.check_shape`),
            or the model uses something Titan does not carry (:func:`check_supported`).
    """
    pyconfig = _import("maxtext.configs.pyconfig")
    types = _import("maxtext.configs.types")
    settings = dict(model.settings)
    models = os.path.join(os.path.dirname(pyconfig.__file__), "models")
    names = {f.removesuffix(".yml") for f in os.listdir(models) if f.endswith(".yml")}
    if model.name.replace("-Instruct", "") not in names:  # as MaxText reads the name
        raise TitanError(f"--maxtext-model {model.name}: no such MaxText model (see {models})")
    maxtext_errors.check_keys(settings, types.MaxTextConfig.model_fields)
    keys = model.config_keys(n_layers, dtype, tensor_sharded)
    try:
        with maxtext_errors.quiet():  # MaxText's own error handler logs and may sys.exit(2)
            config = pyconfig.HyperParameters(pyconfig._initialize_pydantic([""], **keys))
    except Exception as err:  # noqa: BLE001 - MaxText's config errors are pydantic's or its own
        raise maxtext_errors.config_error(err, settings) from None
    maxtext_errors.check_shape(config, settings)
    check_supported(config, model.name)
    return config


def check_supported(config: Any, name: str) -> None:
    """Refuse a MaxText config that uses what Titan does not carry, in one line.

    Raises:
        TitanError: quantisation, MLA, multi-token prediction, multimodal, MaxText's pipeline,
            vocabulary tiling, a family with non-parameter state, or an untested family.
    """
    block = config.decoder_block.value
    refusals = [
        (bool(config.quantization), f"quantisation ({config.quantization})"),
        (config.attention_type == "mla", "multi-head latent attention (MLA)"),
        (config.mtp_num_layers > 0, "multi-token prediction (mtp_num_layers)"),
        (bool(config.use_multimodal), "multimodal encoders (use_multimodal)"),
        (config.ici_pipeline_parallelism > 1, "MaxText's pipeline (use --layout mpmd --pp)"),
        (config.num_vocab_tiling > 1, "vocabulary tiling (num_vocab_tiling)"),
        (bool(config.routed_bias), "a routing bias updated outside the gradient (routed_bias)"),
        (
            bool(config.moe_use_megatron_seq_aux_loss),
            "Megatron's sequence load-balancing loss (moe_use_megatron_seq_aux_loss)",
        ),
        (block not in FAMILIES, f"decoder_block {block} (carried: {', '.join(FAMILIES)})"),
    ]
    for refused, what in refusals:
        if refused:
            raise TitanError(f"--maxtext-model {name}: Titan does not carry {what}")


def _pure(state: Any) -> PyTree:
    return state.to_pure_dict()


@dataclass(frozen=True)
class _Built:
    """One chunk's MaxText model, abstract: its graph, parameter state, RNG streams, any other
    state, and the parameters' logical axes (MaxText's names)."""

    graphdef: Any
    params: Any
    rngs: Any
    other: Any
    logical: PyTree


def _mesh_for_build() -> Any:
    """The mesh of the trace in progress (the layouts trace under ``jax.set_mesh``; MaxText's
    layers need the concrete mesh, which JAX keeps in ``jax._src.mesh``), else one device."""
    mesh = jax._src.mesh.get_concrete_mesh()
    if not mesh.empty:
        return mesh
    devices = np.array(jax.devices()[:1]).reshape(1, 1, 1)
    return jax.sharding.Mesh(devices, MESH_AXES)


def _tensor_sharded(mesh: Any) -> bool:
    """Whether ``mesh``'s tensor axis has more than one device."""
    return dict(mesh.shape).get("tensor", 1) > 1


def _key_or_zeros(leaf: Any) -> jax.Array:
    """A value for an abstract non-parameter leaf: RNG keys of seed 0, zeros otherwise (the
    forward pass is deterministic: dropout is off)."""
    if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
        return jnp.broadcast_to(jax.random.key(0), leaf.shape)
    return jnp.zeros(leaf.shape, leaf.dtype)


def _cross_entropy(logits: jax.Array, targets: jax.Array) -> jax.Array:
    """(B, S) per-token cross-entropy in float32 of (B, S, V) logits."""
    logits = logits.astype(jnp.float32)
    picked = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    return jax.nn.logsumexp(logits, axis=-1) - picked


@dataclass(frozen=True)
class MaxTextAdapter:
    """A MaxText decoder as a :class:`titan.models.adapters.base.ModelAdapter`.

    Attributes:
        model: the MaxText model and its settings.
        document_mask: attention stays within a document (segment ids); False: causal over the
            sequence.

    Raises (on construction):
        TitanError: the layers are not scanned on axis 1, a MaxText logical axis has no rule,
            or the model carries state besides its parameters and RNG streams (names it).
    """

    model: MaxTextModel
    document_mask: bool = True
    layer_axis: int = 1  # MaxText's param_scan_axis

    def __post_init__(self) -> None:
        config = self.config_of(None)
        if config.param_scan_axis != self.layer_axis or not config.scan_layers:
            raise TitanError(
                "--maxtext-set: Titan cuts MaxText's scanned layers on axis 1 "
                "(scan_layers=true, param_scan_axis=1)"
            )
        whole = whole_model(self.n_layers)
        self.logical_names(whole)  # every name has a rule
        state = jax.tree_util.tree_leaves_with_path(self.model_state(whole))
        if state:  # the layouts train the parameters and their optimizer state only
            raise TitanError(
                f"--maxtext-model {self.model.name}: Titan does not carry non-parameter state "
                f"({', '.join(jax.tree_util.keystr(path) for path, _ in state)})"
            )

    def config_of(self, n_layers: int | None, dtype: str = "float32") -> Any:
        return load_config(self.model, n_layers, dtype)

    @property
    def family(self) -> str:
        return FAMILIES[self.config_of(None).decoder_block.value]

    @property
    def n_layers(self) -> int:
        return int(self.config_of(None).base_num_decoder_layers)

    @property
    def config(self) -> ModelConfig:
        """The model's shape as Titan's planner reads it (a Llama of the same widths; MoE
        experts and sliding windows are not modelled there)."""
        c = self.config_of(None)
        return ModelConfig(
            f"maxtext:{self.model.name}",
            int(c.vocab_size),
            int(c.emb_dim),
            self.n_layers,
            int(c.num_query_heads),
            int(c.num_kv_heads),
            int(c.mlp_dim),
            rope_theta=float(c.rope_max_timescale),
            norm_eps=float(c.normalization_layer_epsilon),
        )

    def _built(self, chunk: Chunk, dtype: str = "float32") -> _Built:
        return _build(self.model, chunk.n_layers, dtype, _mesh_for_build())

    def _keeps(self, path: tuple, chunk: Chunk) -> bool:
        """Whether ``chunk`` holds the parameter at ``path`` (of a whole Transformer).

        Raises:
            TitanError: the model ties its embedding to its output head and ``chunk`` has one
                end of the model but not the other (stages would train two copies).
        """
        keys = [getattr(k, "key", None) for k in path]
        if self.load_balanced and chunk.first != chunk.last:
            raise TitanError(
                f"--maxtext-model {self.model.name}: the MoE load-balancing loss "
                "(load_balance_loss_weight > 0) is not carried across pipeline stages: use "
                "--layout spmd or --maxtext-set load_balance_loss_weight=0"
            )
        if self.tied and chunk.first != chunk.last:
            raise TitanError(
                f"--maxtext-model {self.model.name} ties its embedding to its output head "
                "(logits_via_embedding), which Titan does not cut across pipeline stages: use "
                "--layout spmd or --maxtext-set logits_via_embedding=false"
            )
        if keys[0] == "token_embedder":
            return chunk.first
        if keys[:2] == ["decoder", "layers"]:
            return True
        return chunk.last

    @property
    def load_balanced(self) -> bool:
        """Whether the loss has MaxText's MoE load-balancing term (:func:`_load_balance_loss`)."""
        c = self.config_of(None)
        return c.num_experts > 1 and c.load_balance_loss_weight > 0

    def loss_terms(self) -> tuple[str, ...]:
        return ("moe_lb_loss",) if self.load_balanced else ()

    @property
    def tied(self) -> bool:
        return bool(self.config_of(None).logits_via_embedding)

    def _select(self, tree: PyTree, chunk: Chunk) -> PyTree:
        """The part of a whole-Transformer tree ``chunk`` holds."""
        flat = jax.tree_util.tree_flatten_with_path(tree, is_leaf=_is_spec)[0]
        kept: dict[str, Any] = {}
        for path, leaf in flat:
            if self._keeps(path, chunk):
                node = kept
                for key in path[:-1]:
                    node = node.setdefault(key.key, {})
                node[path[-1].key] = leaf
        return kept

    def logical_names(self, chunk: Chunk) -> PyTree:
        """``chunk``'s parameters' logical axes with Titan's names (``PartitionSpec`` leaves).

        Raises:
            TitanError: a MaxText name has no rule (names it).
        """
        built = self._built(chunk)
        return jax.tree.map(
            lambda spec: jax.sharding.PartitionSpec(*(a and titan_axis(a) for a in spec)),
            self._select(built.logical, chunk),
            is_leaf=_is_spec,
        )

    def describe(self) -> dict[str, Any]:
        c = self.config_of(None)
        return {
            "family": self.family,
            "layers_by": f"maxtext {MAXTEXT_VERSION}",
            "maxtext_model": self.model.name,
            "decoder_block": c.decoder_block.value,
            "settings": dict(self.model.settings),
            "attention": c.attention,
            "remat_policy": c.remat_policy,
            "tied_embedding": self.tied,
            "load_balance_loss_weight": float(c.load_balance_loss_weight),
        }

    def param_count(self) -> int:
        shapes, _ = self.abstract_params(whole_model(self.n_layers))
        return sum(int(np.prod(leaf.shape)) for leaf in jax.tree.leaves(shapes))

    def token_flops(self) -> tuple[dict[str, float], dict[str, float]]:
        """(model, hardware) training FLOPs per token: 6 x the matmul parameters a token passes
        through (MoE experts scaled by experts per token / experts; norms and the embedding
        lookup excluded), plus attention 12 x layers x seq x (heads x head_dim), halved for the
        ``causal`` convention (Chinchilla-style count, Hoffmann et al. 2022, App. F), plus the
        recomputed forward work of Titan's ``--remat`` policy (:mod:`titan.remat`)."""
        c = self.config_of(None)
        shapes, logical = self.abstract_params(whole_model(self.n_layers))
        flat_shapes = jax.tree.leaves(shapes)
        flat_logical = jax.tree.leaves(logical, is_leaf=_is_spec)
        raw = jax.tree.leaves(self._built(whole_model(self.n_layers)).logical, is_leaf=_is_spec)
        layer_matmul = head = 0.0
        for leaf, spec, names in zip(flat_shapes, flat_logical, raw, strict=True):
            size = float(np.prod(leaf.shape))
            if "layers" in spec and leaf.ndim > 2:
                share = c.num_experts_per_tok / c.num_experts if "exp" in names else 1.0
                layer_matmul += 2.0 * size * share / self.n_layers
            elif "vocab" in spec and not names[0] == "vocab":
                head += 2.0 * size
        if self.tied:
            head = 2.0 * c.emb_dim * c.vocab_size
        # attention sublayers per scanned layer: 2 for gemma2's (local, global) pairs
        queries = jax.tree_util.tree_flatten_with_path(shapes)[0]
        sublayers = sum("['query']" in jax.tree_util.keystr(path) for path, _ in queries)
        width = c.num_query_heads * c.head_dim
        model, hardware = {}, {}
        for convention in ATTENTION_CONVENTIONS:
            scale = 0.5 if convention == "causal" else 1.0
            attention = 4.0 * self.model.seq_len * width * scale * sublayers
            forward = self.n_layers * (layer_matmul + attention) + head
            recomputed = REMAT_POLICIES[self.model.remat].recomputed(layer_matmul, attention)
            model[convention] = 3.0 * forward
            hardware[convention] = 3.0 * forward + self.n_layers * recomputed
        return model, hardware

    def abstract_params(self, chunk: Chunk) -> tuple[PyTree, PyTree]:
        built = self._built(chunk)
        shapes = jax.tree.map(
            lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype),
            self._select(_pure(built.params), chunk),
        )
        return shapes, self.logical_names(chunk)

    def init_params(self, key: jax.Array) -> PyTree:
        """The whole model's initial parameters from MaxText's own initialisers (traceable)."""
        models = _import("maxtext.models.models")
        nnx = importlib.import_module("flax.nnx")
        mesh = _mesh_for_build()
        config = load_config(self.model, None, "float32", _tensor_sharded(mesh))
        with nn.logical_axis_rules(mesh_rules()):
            model = models.Transformer(config, mesh, None, rngs=nnx.Rngs(params=key, dropout=0))
        return _pure(nnx.state(model, nnx.Param))

    def is_layer_stacked(self, path: tuple) -> bool:
        """``decoder/layers/...`` of the parameters, and of their optimizer moments (whose
        paths start with the optimizer's own keys)."""
        keys = [getattr(k, "key", None) for k in path]
        return any(keys[i : i + 2] == ["decoder", "layers"] for i in range(len(keys)))

    def model_state(self, chunk: Chunk) -> PyTree:
        """Non-parameter state other than RNG streams (none for the carried families: the
        adapter refuses a model with any on construction)."""
        return _pure(self._built(chunk).other)

    def batch_shapes(self, batch_size: int) -> dict[str, jax.ShapeDtypeStruct]:
        return next_token_batch(batch_size, self.model.seq_len)

    def stage_inputs(self, batch: dict[str, Any]) -> StageInputs:
        return next_token_inputs(batch)

    def activation(self, rows: int, dtype: jnp.dtype) -> tuple[tuple[int, ...], jnp.dtype]:
        return (rows, self.model.seq_len, int(self.config_of(None).emb_dim)), dtype

    def _full_params(self, chunk: Chunk, params: PyTree, built: _Built) -> Any:
        """The chunk's Transformer state: ``params`` where the chunk has them, zeros for the
        parts it does not run (the embedding of a later chunk, the head of an earlier one)."""
        nnx = importlib.import_module("flax.nnx")
        whole = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), _pure(built.params))

        def merge(base: dict, given: dict) -> dict:
            return {
                k: merge(v, given[k]) if isinstance(v, dict) and k in given else given.get(k, v)
                for k, v in base.items()
            }

        state = jax.tree.map(lambda leaf: leaf, built.params)  # a copy: the build is shared
        nnx.replace_by_pure_dict(state, merge(whole, params))
        return state

    def forward(
        self,
        chunk: Chunk,
        params: PyTree,
        x: jax.Array,
        every: dict[str, jax.Array],
        last: dict[str, jax.Array],
        dtype: jnp.dtype,
    ) -> jax.Array | LossAndTerms:
        nnx = importlib.import_module("flax.nnx")
        built = self._built(chunk, str(jnp.dtype(dtype)))
        rngs = jax.tree.map(_key_or_zeros, built.rngs)
        model = nnx.merge(built.graphdef, self._full_params(chunk, params, built), rngs)
        segment_ids = every["segment_ids"] + 1  # MaxText's segment 0 is padding
        if not self.document_mask:
            segment_ids = jnp.ones_like(segment_ids)
        positions = jnp.broadcast_to(jnp.arange(segment_ids.shape[1]), segment_ids.shape)
        tokens = x if chunk.first else jnp.zeros(segment_ids.shape, jnp.int32)
        with nn.logical_axis_rules(mesh_rules()):
            logits, hidden, _ = model.decoder(
                shared_embedding=model.token_embedder,
                decoder_input_tokens=tokens,
                decoder_input_embeddings=None if chunk.first else x.astype(dtype),
                decoder_positions=positions,
                decoder_segment_ids=segment_ids,
                deterministic=True,
                model_mode="train",
            )[:3]
        if not chunk.last:
            return hidden.astype(dtype)
        loss = jnp.mean(_cross_entropy(logits, last["targets"]))
        if not self.load_balanced:
            return loss
        balance = _load_balance_loss(model)
        return loss + balance, {"moe_lb_loss": balance}


_SEAM: type[ModelAdapter] = MaxTextAdapter  # mypy checks the family against the seam


def _load_balance_loss(model: Any) -> jax.Array:
    """MaxText's MoE load-balancing loss of the forward pass just run, as MaxText's pre-training
    step adds it to the loss (``maxtext/trainers/pre_train/train.py``): the mean over the layers
    of the ``moe_lb_loss`` each MoE layer sows, already scaled by ``load_balance_loss_weight``
    (``maxtext/layers/moe.py``, ``load_balance_loss``); recorded as the step's ``moe_lb_loss``.
    0 where no layer sows it."""
    nnx = importlib.import_module("flax.nnx")
    sown = nnx.pop(model, nnx.Intermediate).to_pure_dict()
    losses = [
        jnp.ravel(value)
        for path, value in jax.tree_util.tree_leaves_with_path(sown)
        if [k.key for k in path if hasattr(k, "key")][-1:] == ["moe_lb_loss"]  # (value,) tuples
    ]
    return jnp.mean(jnp.concatenate(losses)) if losses else jnp.zeros((), jnp.float32)


def _is_spec(x: Any) -> bool:
    return isinstance(x, jax.sharding.PartitionSpec)


@functools.cache
def _build(model: MaxTextModel, n_layers: int, dtype: str, mesh: Any) -> _Built:
    """The abstract Transformer of ``n_layers`` layers (no arrays are created)."""
    models = _import("maxtext.models.models")
    nnx = importlib.import_module("flax.nnx")
    config = load_config(model, n_layers, dtype, _tensor_sharded(mesh))
    try:
        with nn.logical_axis_rules(mesh_rules()), maxtext_errors.quiet():
            abstract = nnx.eval_shape(
                lambda: models.Transformer(config, mesh, None, rngs=nnx.Rngs(params=0, dropout=0))
            )
    except (ValueError, TypeError) as err:  # the model's construction, no training yet
        raise maxtext_errors.build_error(err, dict(model.settings)) from None
    graphdef, params, rngs, other = nnx.split(abstract, nnx.Param, nnx.RngState, ...)
    logical = nnx.get_partition_spec(params).to_pure_dict()
    return _Built(graphdef, params, rngs, other, logical)
