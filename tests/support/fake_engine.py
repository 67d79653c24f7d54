"""A fake engine for tier-2 tests: scripted events, real threads, no MLX."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.engine import Engine
from engine.errors import EngineFailed
from engine.loader import LoadedModel
from engine.types import Aborted, Counters, Event, Finished, FinishReason, Request, TextDelta, Usage


class FakeTokenizer:
    """Enough of mlx-lm's TokenizerWrapper for the protocols: one id per character."""

    eos_token_ids = {0}
    has_chat_template = True

    def __len__(self) -> int:
        return 1000

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [ord(c) % 1000 for c in text]

    def decode(self, ids: list[int]) -> str:
        return "".join(chr(i) for i in ids)

    def apply_chat_template(self, messages: list[dict[str, Any]], **kwargs: Any) -> list[int]:
        text = "".join(f"<{m['role']}>{m.get('content') or ''}" for m in messages) + "<assistant>"
        return self.encode(text)


@dataclass(slots=True)
class ScriptedRunner:
    """Emits `pieces` one per step, `step_s` apart; can fail after `fail_after` pieces."""

    counters: Counters
    pieces: list[str]
    step_s: float = 0.0
    fail_after: int | None = None
    steps_taken: list[int] = field(default_factory=list)

    def run(self, req: Request, is_aborted: Callable[[], bool]) -> Iterator[Event]:
        n = 0
        for i, piece in enumerate(self.pieces[: req.max_tokens]):
            if is_aborted():
                self.steps_taken.append(n)
                raise Aborted
            if self.fail_after is not None and i == self.fail_after:
                raise RuntimeError("simulated engine fault")
            time.sleep(self.step_s)
            n += 1
            self.counters.generated_tokens += 1
            yield TextDelta(piece, (i,))
        self.steps_taken.append(n)
        reason = FinishReason.LENGTH if n == req.max_tokens else FinishReason.STOP
        yield Finished(reason, Usage(len(req.prompt_tokens), n))


def fake_engine(pieces: list[str], *, step_s: float = 0.0, fail_after: int | None = None,
                load_gate: threading.Event | None = None, load_error: str | None = None
                ) -> tuple[Engine, list[ScriptedRunner]]:
    runners: list[ScriptedRunner] = []

    def load() -> LoadedModel:
        if load_gate is not None:
            load_gate.wait(10)
        if load_error:
            raise RuntimeError(load_error)
        return LoadedModel(model=None, tokenizer=FakeTokenizer(), model_id="fake-model", path=Path("."))

    def make_runner(loaded: Any, counters: Counters) -> ScriptedRunner:
        runners.append(ScriptedRunner(counters, pieces, step_s, fail_after))
        return runners[-1]

    return Engine(load, make_runner), runners


__all__ = ["EngineFailed", "fake_engine", "FakeTokenizer", "ScriptedRunner"]
