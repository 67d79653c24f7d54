"""Grammars walked against the model's vocabulary before a request is admitted, on threads of
their own.

A grammar that compiles may still match nothing (`start: start`, a `$ref` cycle), pass
llguidance's lexer limits only with a byte-level vocabulary, or hold an alternation wider than
one parser row: followed by a row, each ended as an empty answer or a truncated one. Walked here
for a few tokens with the model's own vocabulary, each is a 400 before any byte of an answer.

The walk is CPU work in llguidance: it runs on GRAMMAR_WORKERS threads of this module's pool,
never the event loop's default executor, so grammars cannot starve the requests without one. At
most GRAMMAR_WAITING checks wait for a thread (past that: 429, retry); one that takes longer
than GRAMMAR_TIMEOUT_S is a 400 (its thread finishes it and is free again).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from mlx_serve.engine.errors import InvalidRequest, QueueFull, grammar_message

if TYPE_CHECKING:
    from mlx_serve.engine.rows.grammar import GrammarTokenizer

GRAMMAR_WORKERS = 2
GRAMMAR_WAITING = 16
GRAMMAR_TIMEOUT_S = 10.0


class GrammarChecks:
    """The pool, the bound on waiting checks and the vocabulary (built on the first grammar)."""

    def __init__(self, wrapper: Any, timeout_s: float = GRAMMAR_TIMEOUT_S) -> None:
        self._wrapper = wrapper
        self._timeout_s = timeout_s
        self._pool = ThreadPoolExecutor(GRAMMAR_WORKERS, thread_name_prefix="mlx-serve-grammar")
        self._vocab: GrammarTokenizer | None = None
        self._vocab_lock = threading.Lock()
        self.pending = 0

    async def check(self, grammars: Iterable[str], param: str = "response_format") -> None:
        """InvalidRequest naming `param` for the first grammar this vocabulary cannot follow."""
        for grammar in grammars:
            if self.pending >= GRAMMAR_WORKERS + GRAMMAR_WAITING:
                raise QueueFull("too many structured-output grammars are being checked; retry shortly")
            self.pending += 1  # until its thread is done with it, whoever waits
            job = asyncio.get_running_loop().run_in_executor(self._pool, self._walk, grammar)
            job.add_done_callback(self._done)
            try:
                async with asyncio.timeout(self._timeout_s):
                    why = await asyncio.shield(job)
            except TimeoutError:
                raise InvalidRequest(
                    f"the grammar took over {self._timeout_s:g} s to compile; simplify it", param=param
                ) from None
            if why is not None:
                raise InvalidRequest(f"this model cannot follow the grammar: {why}", param=param)

    def _done(self, _: object) -> None:
        self.pending -= 1

    def _walk(self, grammar: str) -> str | None:
        try:
            return self._tokenizer().dry_run(grammar)
        except Exception as exc:  # noqa: BLE001 - llguidance's refusal is the client's answer
            return grammar_message(exc)

    def _tokenizer(self) -> GrammarTokenizer:
        with self._vocab_lock:
            if self._vocab is None:
                from mlx_serve.engine.rows.grammar import GrammarTokenizer  # llguidance loads only when used

                self._vocab = GrammarTokenizer(self._wrapper)
            return self._vocab

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
