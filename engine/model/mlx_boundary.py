"""What the engine uses of mlx-lm (and of MLX's few untyped corners), typed once.

mlx-lm ships `py.typed`, but most of what the engine touches is unannotated: the model is an
`nn.Module` the checker cannot see into, the caches' and batches' attributes are inferred from
`None` and `[]`, and a few annotations are wrong (`trim_prompt_cache` returns an int). Here
the type checker gets those pieces as the engine relies on them: Protocols for what the engine
only calls (the model, a cache layer, the tokenizer), and, under TYPE_CHECKING, declarations of
the classes it builds or subclasses with just the members it touches. At run time every name
is mlx-lm's own object, imported below, so nothing wraps the hot path.

The engine imports mlx-lm through this module (the loader aside): it is the list of the mlx-lm
API we depend on, and the place to look when mlx-lm changes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import mlx.core as mx
from mlx_lm.generate import StopSequences, generation_stream
from mlx_lm.models.cache import (
    ArraysCache,
    BatchRotatingKVCache,
    CacheList,
    ChunkedKVCache,
    RotatingKVCache,
)
from mlx_lm.sample_utils import apply_min_p, apply_top_k, apply_top_p, greedy_sampler, make_logits_processors

Sampler = Callable[[mx.array], mx.array]  # logprobs (B, vocab) -> tokens (B,)
LogitsProcessor = Callable[[mx.array, mx.array], mx.array]  # (token context, logits) -> logits


class CacheLayer(Protocol):
    """One layer of a prompt cache, of whichever kind the model makes (KVCache, RotatingKVCache,
    ArraysCache, ...), alone or batched."""

    @property
    def state(self) -> object: ...  # the arrays to evaluate (a tuple, or a tree of them)


class Model(Protocol):
    """An mlx-lm model: token ids (B, L) through one cache layer per model layer, logits
    (B, L, vocab) out. The cache is written in place."""

    def __call__(self, inputs: mx.array, cache: Sequence[CacheLayer] | None = None) -> mx.array: ...

    def parameters(self) -> dict[str, object]: ...  # a tree of arrays (mlx.nn.Module's)


class Detokenizer(Protocol):
    """mlx-lm's streaming detokenizer: tokens in, the text they completed out."""

    @property
    def last_segment(self) -> str: ...

    def add_token(self, token: int) -> None: ...

    def finalize(self) -> None: ...


class Tokenizer(Protocol):
    """mlx-lm's TokenizerWrapper, as the engine's core uses it (everything else it reads is
    optional and read with getattr: chat template, tool-call and thinking markers)."""

    @property
    def eos_token_ids(self) -> Iterable[int]: ...

    @property
    def detokenizer(self) -> Detokenizer: ...  # a fresh one per access

    def decode(self, token_ids: list[int]) -> str: ...


if TYPE_CHECKING:
    from typing import Self

    def async_eval(*trees: object) -> None: ...

    def make_prompt_cache(model: Model, max_kv_size: int | None = None) -> list[CacheLayer]: ...

    def can_trim_prompt_cache(cache: Sequence[CacheLayer]) -> bool: ...

    def trim_prompt_cache(cache: Sequence[CacheLayer], num_tokens: int) -> int: ...

    def create_causal_mask(
        N: int,
        offset: int = 0,
        window_size: int | None = None,
        right_padding: mx.array | None = None,
        left_padding: mx.array | None = None,
    ) -> mx.array: ...

    class KVCache:
        keys: mx.array | None  # (1, heads, slots, dim); None until the first write
        values: mx.array | None
        offset: int

        def __init__(self) -> None: ...
        @property
        def state(self) -> tuple[mx.array | None, mx.array | None, int]: ...
        @classmethod
        def merge(cls, caches: list[KVCache]) -> BatchKVCache: ...

    class BatchKVCache:
        """Rows left-padded to one shared write position `_idx`; `offset` is per row."""

        keys: mx.array | None  # (B, heads, slots, dim); None until the first write
        values: mx.array | None
        offset: mx.array  # (B,)
        left_padding: mx.array  # (B,)
        _idx: int

        def __init__(self, left_padding: list[int]) -> None: ...
        @property
        def state(self) -> tuple[mx.array | None, mx.array | None, mx.array, mx.array, int]: ...
        def make_mask(self, N: int, return_array: bool = False, **kwargs: Any) -> mx.array | None: ...
        def filter(self, batch_indices: list[int]) -> None: ...
        def extend(self, other: BatchKVCache) -> None: ...
        def extract(self, idx: int) -> KVCache: ...
        def trim(self, n: int) -> int: ...

    class QuantizedKVCache:
        """One row's KV as `mx.quantize` triples (packed values, scales, biases)."""

        keys: Any  # a triple of (1, heads, slots, ·) arrays; None until the first write
        values: Any
        offset: int
        group_size: int
        bits: int

        def __init__(self, group_size: int = 64, bits: int = 8) -> None: ...
        @property
        def state(self) -> Any: ...

    class TokenBuffer:
        """A row's token context for its logits processors."""

        @property
        def tokens(self) -> mx.array: ...
        def update_and_fetch(self, tokens: mx.array) -> mx.array: ...

    class PromptProcessingBatch:
        """Rows being prefilled, in one batch cache; `generate` turns them into decoding rows."""

        model: Model
        uids: list[int]
        tokens: list[list[int]]  # each row's tokens in the cache
        prompt_cache: list[Any]  # batch caches: each has prepare(lengths=, right_padding=) and finalize()
        samplers: list[Sampler]
        logits_processors: list[list[LogitsProcessor]]
        max_tokens: list[int]
        stop_sequences: list[StopSequences]

        def __init__(
            self,
            model: Model,
            uids: list[int],
            caches: list[list[CacheLayer]],
            tokens: list[list[int]] | None = None,
            prefill_step_size: int = 2048,
            samplers: list[Sampler] | None = None,
            fallback_sampler: Sampler | None = None,
            logits_processors: list[list[LogitsProcessor]] | None = None,
            stop_sequences: list[StopSequences] | None = None,
            max_tokens: list[int] | None = None,
        ) -> None: ...
        def __len__(self) -> int: ...
        def extract_cache(self, idx: int) -> list[CacheLayer]: ...
        def extend(self, batch: PromptProcessingBatch) -> None: ...
        def prompt(self, tokens: list[list[int]]) -> None: ...
        def generate(self, tokens: list[list[int]]) -> GenerationBatch: ...

    class GenerationBatch:
        """Decoding rows. Each row's per-row lists are never None as the engine builds them
        (through PromptProcessingBatch or `empty`), though mlx-lm's signature allows it."""

        class Response:
            uid: int
            token: int
            logprobs: mx.array  # (vocab,)

        model: Model
        uids: list[int]
        prompt_cache: list[CacheLayer]
        tokens: list[list[int]]  # each row's tokens in the cache (its pending token not yet)
        samplers: list[Sampler]
        fallback_sampler: Sampler
        logits_processors: list[list[LogitsProcessor]]
        _next_tokens: mx.array | None  # each row's pending input token; None once the batch is empty
        _next_logprobs: list[mx.array]
        _token_context: list[TokenBuffer]
        _num_tokens: list[int]

        def __len__(self) -> int: ...
        def extend(self, batch: GenerationBatch) -> None: ...
        def extract_cache(self, idx: int) -> list[CacheLayer]: ...
        def filter(self, keep: list[int]) -> None: ...
        def next(self) -> list[GenerationBatch.Response]: ...
        def _step(self) -> tuple[list[int], list[mx.array]]: ...
        @classmethod
        def empty(cls, model: Model, fallback_sampler: Sampler) -> Self: ...

else:
    from mlx.core import async_eval
    from mlx_lm.generate import GenerationBatch, PromptProcessingBatch
    from mlx_lm.models.base import create_causal_mask
    from mlx_lm.models.cache import (
        BatchKVCache,
        KVCache,
        QuantizedKVCache,
        TokenBuffer,
        can_trim_prompt_cache,
        make_prompt_cache,
        trim_prompt_cache,
    )

__all__ = [
    "ArraysCache",
    "BatchKVCache",
    "BatchRotatingKVCache",
    "CacheLayer",
    "CacheList",
    "ChunkedKVCache",
    "Detokenizer",
    "GenerationBatch",
    "KVCache",
    "LogitsProcessor",
    "Model",
    "PromptProcessingBatch",
    "QuantizedKVCache",
    "RotatingKVCache",
    "Sampler",
    "StopSequences",
    "TokenBuffer",
    "Tokenizer",
    "apply_min_p",
    "apply_top_k",
    "apply_top_p",
    "async_eval",
    "can_trim_prompt_cache",
    "create_causal_mask",
    "generation_stream",
    "greedy_sampler",
    "make_logits_processors",
    "make_prompt_cache",
    "trim_prompt_cache",
]
