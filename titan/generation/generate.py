"""``titan generate``: text from a checkpoint, streamed to the terminal token by token.

The prompt (BOS, then its ids) is prefilled in one call of the cached forward
(:func:`titan.models.kv_cache.cached_forward`), then one token at a time is decoded, each step
one call of a jitted program that writes the token's keys and values into the cache, samples
the next token (:func:`titan.generation.next_token.sample`) and splits the PRNG key. The cache is
preallocated to prompt + ``--max-new-tokens`` positions, so the prefill compiles once per
prompt length and the decode step once. Decoding stops after ``--max-new-tokens`` or at an end
token (not printed): every one the tokenizer's config names (:attr:`Tokenizer.end_ids`: EOS,
and Llama 3's ``<|eot_id|>``), and each ``--stop`` token (:func:`stop_ids`). Prompt and new
tokens together fit in the run's ``--seq-len`` (the positions its model was trained to attend
to, :func:`new_token_budget`). Text is printed through
:class:`titan.data.tokenizer.StreamDecoder`, so the streamed pieces join to the decode of all
the ids.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import IO

import jax
import jax.numpy as jnp
import numpy as np

from titan.data.tokenizer import StreamDecoder, Tokenizer
from titan.errors import TitanError
from titan.formatting import format_size
from titan.generation import MAX_TEMPERATURE
from titan.generation.loading import LoadedModel, load_model
from titan.generation.next_token import sample
from titan.inert import inert
from titan.models.kv_cache import cached_forward, init_cache
from titan.ops import Ops
from titan.telemetry.device_memory import host_memory_bytes, usable_bytes


def printable(text: str) -> str:
    """``text`` for the terminal: newlines and tabs kept (generated code has them), every
    other control or bidi character escaped (:func:`titan.inert.inert`)."""
    return "\n".join(inert(line).replace("\\x09", "\t") for line in text.split("\n"))


DEFAULT_NEW_TOKENS = 64


def check_prompt(prompt: str) -> None:
    """Refuse a prompt that is not text: a byte that is not UTF-8, which Python passes on from
    the command line as a lone surrogate (``--prompt $'\\xff'`` is ``"\\udcff"``), or any other
    lone surrogate; no tokenizer encodes those.

    Raises:
        TitanError: names ``--prompt`` and the first offending byte (its offset in the UTF-8
            bytes of the prompt) or surrogate.
    """
    try:
        prompt.encode("utf-8")
    except UnicodeEncodeError as err:
        offset = len(prompt[: err.start].encode("utf-8"))
        code = ord(prompt[err.start])
        what = (
            f"byte {offset}: {code - 0xDC00:#04x}" if 0xDC80 <= code <= 0xDCFF else f"U+{code:04X}"
        )
        raise TitanError(f"--prompt: not UTF-8 text ({what}); give the prompt as UTF-8") from None


def new_token_budget(prompt_tokens: int, seq_len: int, requested: int | None) -> int:
    """Tokens to generate after ``prompt_tokens`` (BOS included): ``requested``, or
    :data:`DEFAULT_NEW_TOKENS` when None, and never past the run's ``seq_len``.

    Raises:
        TitanError: the prompt fills ``seq_len``, or ``requested`` goes past it.
    """
    room = seq_len - prompt_tokens
    if room < 1:
        raise TitanError(
            f"--prompt: {prompt_tokens} tokens (BOS included) leave no room in the run's "
            f"--seq-len {seq_len}"
        )
    if requested is None:
        return min(DEFAULT_NEW_TOKENS, room)
    if requested > room:
        raise TitanError(
            f"--max-new-tokens {requested}: the run's model attends to --seq-len {seq_len} "
            f"positions and the prompt takes {prompt_tokens} (BOS included): at most {room}"
        )
    return requested


def check_cache_fits(loaded: LoadedModel, length: int) -> None:
    """Refuse a key/value cache of ``length`` positions (prompt and new tokens) that, with the
    weights, needs more memory than the device holds: the allocator's pool
    (:func:`~titan.telemetry.device_memory.usable_bytes`), or on XLA:CPU, which reports none,
    the host's memory (:func:`~titan.telemetry.device_memory.host_memory_bytes`). The cache is
    2 x layers x positions x KV heads x head dim elements of the compute dtype
    (:func:`titan.models.kv_cache.init_cache`); XLA would fail to allocate it after the load.

    Raises:
        TitanError: names ``--max-new-tokens``, the cache's and the weights' bytes and the
            memory there is.
    """
    m = loaded.model
    itemsize = jnp.dtype(loaded.dtype).itemsize
    cache = 2 * m.n_layers * length * m.n_kv_heads * m.head_dim * itemsize
    weights = sum(leaf.nbytes for leaf in jax.tree.leaves(loaded.params))
    device = jax.local_devices()[0]
    capacity = usable_bytes([device]) or host_memory_bytes()
    if capacity is not None and cache + weights > capacity:
        where = "this host's memory" if device.platform == "cpu" else f"{device.device_kind}'s pool"
        raise TitanError(
            f"--max-new-tokens: the key/value cache of {length:,} positions takes "
            f"{format_size(cache)} and the weights {format_size(weights)}, more than the "
            f"{format_size(capacity)} of {where}; ask for fewer new tokens"
        )


def stop_ids(tokenizer: Tokenizer, stop: tuple[str, ...]) -> frozenset[int]:
    """The ids that end a generation: the tokenizer's end tokens and each ``--stop`` value, a
    token id when it is all digits (``128008``), else the text of one token (``<|eom_id|>``).

    Raises:
        TitanError: a value is an id past the vocabulary, or the text of no single token.
    """
    ids = set(tokenizer.end_ids)
    for value in stop:
        token = int(value) if value.isascii() and value.isdigit() else tokenizer.token_id(value)
        if token is None or token >= tokenizer.vocab_size:
            raise TitanError(
                f"--stop {value!r}: neither a token id below {tokenizer.vocab_size} nor the "
                "text of one token of the run's tokenizer"
            )
        ids.add(token)
    return frozenset(ids)


@dataclass(frozen=True)
class Sampling:
    """How tokens are drawn (``--temperature``, ``--top-p``, ``--seed``, ``--max-new-tokens``)
    and where drawing stops besides the tokenizer's end tokens (``--stop``: :func:`stop_ids`).

    ``max_new_tokens`` None: :data:`DEFAULT_NEW_TOKENS`, fewer where the run's ``--seq-len``
    leaves less room (:func:`new_token_budget`).

    Raises (on construction):
        TitanError: a temperature outside [0, :data:`MAX_TEMPERATURE`], top_p outside (0, 1],
            fewer than 1 new token or a seed outside [0, 2**32).
    """

    max_new_tokens: int | None = None
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    stop: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.max_new_tokens is not None and self.max_new_tokens < 1:
            raise TitanError(f"--max-new-tokens must be >= 1, got {self.max_new_tokens}")
        if not 0 <= self.temperature <= MAX_TEMPERATURE:
            raise TitanError(
                f"--temperature must be in [0, {MAX_TEMPERATURE:g}] (0: greedy), got "
                f"{self.temperature}"
            )
        if not 0 < self.top_p <= 1:
            raise TitanError(f"--top-p must be in (0, 1], got {self.top_p}")
        if not 0 <= self.seed < 2**32:
            raise TitanError(f"--seed must be in [0, 2**32), got {self.seed}")


@dataclass
class Generator:
    """Decodes from a :class:`titan.generation.loading.LoadedModel` with a KV cache.

    Attributes:
        loaded: the model, its parameters and tokenizer.
        ops: the operators (the registry chooses; attention is the cached native formula).
    """

    loaded: LoadedModel
    ops: Ops = field(default_factory=lambda: Ops(jax.default_backend(), from_env=False))

    def __post_init__(self) -> None:
        self._step = jax.jit(self._forward_and_sample, donate_argnums=1)

    def _forward_and_sample(self, params, cache, tokens, start, key, temperature, top_p):
        logits, cache = cached_forward(self.loaded.model, self.ops, params, tokens, start, cache)
        key, drawn = jax.random.split(key)
        vocab = self.loaded.tokenizer.vocab_size
        return sample(logits[:, -1], drawn, temperature, top_p, vocab), cache, key

    def prompt_ids(self, prompt: str) -> list[int]:
        """BOS, then the prompt's ids (a document's start, as in training).

        Raises:
            TitanError: the prompt is not UTF-8 text (:func:`check_prompt`).
        """
        check_prompt(prompt)
        return [self.loaded.tokenizer.bos_id, *self.loaded.tokenizer.encode(prompt)]

    def tokens(self, prompt_ids: list[int], sampling: Sampling) -> Iterator[int]:
        """The new token ids, one per decode step, until ``max_new_tokens`` or an end token
        (:func:`stop_ids`; excluded).

        Raises:
            TitanError: an empty prompt (not even BOS), more tokens than the run's
                ``--seq-len`` (:func:`new_token_budget`) or the memory holds
                (:func:`check_cache_fits`), or a bad ``--stop`` value.
        """
        if not prompt_ids:
            raise TitanError("--prompt: no tokens")
        ends = stop_ids(self.loaded.tokenizer, sampling.stop)
        budget = new_token_budget(len(prompt_ids), self.loaded.seq_len, sampling.max_new_tokens)
        length = len(prompt_ids) + budget
        check_cache_fits(self.loaded, length)
        cache = init_cache(self.loaded.model, 1, length, self.loaded.dtype)
        knobs = (np.float32(sampling.temperature), np.float32(sampling.top_p))
        key = jax.random.key(sampling.seed)
        params = self.loaded.params
        tokens = jnp.asarray([prompt_ids], jnp.int32)
        token, cache, key = self._step(params, cache, tokens, np.int32(0), key, *knobs)
        for i in range(budget):
            new = int(token[0])
            if new in ends:
                return
            yield new
            if i + 1 < budget:
                start = np.int32(len(prompt_ids) + i)
                token, cache, key = self._step(params, cache, token[:, None], start, key, *knobs)

    def stream(self, prompt: str, sampling: Sampling, out: IO[str]) -> list[int]:
        """Print the prompt, then each new piece of text as soon as it is complete
        (:func:`printable`): the decode of prompt and new ids past the prompt's own, so that a
        space between them survives. Returns the new ids."""
        decoder = StreamDecoder(self.loaded.tokenizer)
        prompt_ids = self.prompt_ids(prompt)
        decoder.push(prompt_ids)  # the context of the first new ids; the prompt is printed as given
        out.write(printable(prompt))
        out.flush()
        ids = []
        try:
            for token in self.tokens(prompt_ids, sampling):
                ids.append(token)
                out.write(printable(decoder.push([token])))
                out.flush()
        except BaseException:  # a stop or an error: the line ends before the one saying why
            out.write("\n")
            out.flush()
            raise
        out.write(printable(decoder.flush()) + "\n")
        out.flush()
        return ids


def generate_from_cli(source: str, step: int | None, prompt: str, sampling: Sampling) -> int:
    """``titan generate``: load, then stream the continuation of ``prompt`` to stdout (the
    checkpoint used goes to stderr, after one line for each newer one that could not be read).
    Returns exit code 0.

    Raises:
        TitanError: bad source, step, sampling or --stop option, a prompt that is not UTF-8, a
            prompt and --max-new-tokens past the run's --seq-len or the memory, or no
            checkpoint to read.
    """
    check_prompt(prompt)  # before the load, which takes a while
    loaded = load_model(source, step)
    for unreadable in loaded.unreadable:
        line = f"titan generate: {unreadable.error}; using checkpoint {loaded.step}"
        print(inert(line), file=sys.stderr, flush=True)
    generator = Generator(loaded)
    # refused before any output, not after the header
    stop_ids(loaded.tokenizer, sampling.stop)
    prompt_ids = generator.prompt_ids(prompt)
    budget = new_token_budget(len(prompt_ids), loaded.seq_len, sampling.max_new_tokens)
    check_cache_fits(loaded, len(prompt_ids) + budget)
    header = f"titan generate: {inert(loaded.run_dir)} step {loaded.step}"
    print(header, file=sys.stderr, flush=True)
    generator.stream(prompt, sampling, sys.stdout)
    return 0
