"""A fake engine for tier-2 tests: the real scheduler and core loop, a scripted runner, no MLX."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlx_serve.engine.batch.core import Core
from mlx_serve.engine.batch.scheduler import Scheduler, SchedulerConfig
from mlx_serve.engine.host.thread import ThreadEngine
from mlx_serve.engine.model.loader import LoadedModel
from mlx_serve.engine.rows.step_records import StepOutput, StepPlan
from mlx_serve.engine.types import Counters, Request
from tests.support.byte_tokenizer import byte_tokenizer

EOS = 0


@dataclass(frozen=True, slots=True)
class FakePlan:
    """What admission reads of a memory plan."""

    context_limit: int


class FakeDetokenizer:
    def __init__(self, pieces: list[str]) -> None:
        self.pieces = pieces
        self.last_segment = ""

    def add_token(self, token: int) -> None:
        self.last_segment = self.pieces[token - 1]

    def finalize(self) -> None:
        self.last_segment = ""


class FakeTokenizer:
    """Enough of mlx-lm's TokenizerWrapper: one id per character in, scripted pieces out."""

    has_chat_template = True

    def __init__(self, pieces: list[str], thinking: bool = False, template: Any = None) -> None:
        self.pieces = pieces
        self.eos_token_ids = {EOS}
        self.think_start, self.think_end = ("<think>", "</think>") if thinking else (None, None)
        self.template = template  # a real tokenizer whose Jinja chat template renders the text

    @property
    def chat_template(self) -> str | None:
        return None if self.template is None else str(self.template.chat_template)

    def __len__(self) -> int:
        return 1000

    @property
    def detokenizer(self) -> FakeDetokenizer:
        return FakeDetokenizer(self.pieces)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [ord(c) % 1000 for c in text]

    def encode_continuation(self, text: str) -> list[int]:
        return self.encode(text)

    def decode(self, ids: list[int]) -> str:
        return "".join(chr(i) for i in ids)

    def apply_chat_template(
        self, messages: list[dict[str, Any]], tokenize: bool = True, **kwargs: Any
    ) -> str | list[int]:
        if self.template is not None:
            text = self.template.apply_chat_template(messages, tokenize=False, **kwargs)
        else:
            text = "".join(f"<{m['role']}>{m.get('content') or ''}" for m in messages) + "<assistant>"
        return self.encode(text) if tokenize else text


@dataclass(frozen=True, slots=True)
class Fault:
    """A fault injected into one row: raise at `admit`; fail its `prefill` chunk; fail it in
    `decode` at its `at`-th token; or emit `token` as its `at`-th token (a `token` fault)."""

    phase: str
    at: int = 0
    token: int = 0


@dataclass(slots=True)
class ScriptedRunner:
    """Row k-th token is id k (piece k-1), then EOS; `step_s` per step; a fault no row can be
    blamed for after `fail_after` tokens; `faults` hurt one row each, as the real runner reports
    them (StepOutput.failed) or as admit raises."""

    pieces: list[str]
    step_s: float = 0.0
    fail_after: int | None = None
    faults: dict[str, Fault] = field(default_factory=dict)
    rows: dict[str, int] = field(default_factory=dict)
    steps_taken: list[int] = field(default_factory=list)
    max_rows_seen: int = 0
    resets: int = 0

    def admit(self, request: Request, cache: Any = None, num_cached: int = 0, constraint: Any = None) -> None:
        if self._fault(request.id, "admit") is not None:
            raise RuntimeError("injected fault at admit")
        self.rows[request.id] = -1

    def _fault(self, seq_id: str, phase: str) -> Fault | None:
        fault = self.faults.get(seq_id)
        return fault if fault is not None and fault.phase == phase else None

    def step(self, plan: StepPlan) -> StepOutput:
        for seq_id in plan.release:
            if seq_id in self.rows:
                self.steps_taken.append(max(self.rows.pop(seq_id), 0))
        failed: dict[str, str] = {}
        for chunk in plan.prefill:
            if self._fault(chunk.seq_id, "prefill") is not None:
                self.rows.pop(chunk.seq_id, None)
                failed[chunk.seq_id] = "RuntimeError: injected fault in a prefill chunk"
            elif chunk.final:
                self.rows[chunk.seq_id] = 0
        live = {s: n for s, n in self.rows.items() if n >= 0}
        self.max_rows_seen = max(self.max_rows_seen, len(live))
        time.sleep(self.step_s)
        out = {}
        for seq_id, n in live.items():
            if self.fail_after is not None and n == self.fail_after:
                raise RuntimeError("simulated engine fault")
            if (fault := self._fault(seq_id, "decode")) is not None and n == fault.at:
                self.rows.pop(seq_id)
                failed[seq_id] = "RuntimeError: injected fault in decode"
                continue
            self.rows[seq_id] = n + 1
            out[seq_id] = n + 1 if n < len(self.pieces) else EOS
            if (fault := self._fault(seq_id, "token")) is not None and n == fault.at:
                out[seq_id] = fault.token
        return StepOutput(out, failed=failed)

    def reset(self) -> None:
        self.rows.clear()
        self.resets += 1


def fake_engine(
    pieces: list[str],
    *,
    step_s: float = 0.0,
    fail_after: int | None = None,
    load_gate: threading.Event | None = None,
    load_error: str | None = None,
    max_running: int = 32,
    capacity: int = 1 << 30,
    thinking: bool = False,
    tool_parser: str | None = None,
    templated: bool = False,
    context: int | None = None,
) -> tuple[ThreadEngine, list[ScriptedRunner]]:
    """`templated`: prompts are rendered by a real Jinja chat template (ChatML, with tools);
    `context`: the longest prompt + max_tokens a request may use, as a memory plan would say."""
    runners: list[ScriptedRunner] = []
    template = byte_tokenizer() if templated else None

    def load() -> LoadedModel:
        if load_gate is not None:
            load_gate.wait(10)
        if load_error:
            raise RuntimeError(load_error)
        tokenizer = FakeTokenizer(pieces, thinking, template)
        return LoadedModel(model=None, tokenizer=tokenizer, model_id="fake-model", path=Path("."))

    def make_core(loaded: LoadedModel, counters: Counters) -> Core:
        runners.append(ScriptedRunner(pieces, step_s, fail_after))
        config = SchedulerConfig(max_running=max_running)
        scheduler = Scheduler(config, frozenset({EOS}))
        core = Core(scheduler, runners[-1], loaded.tokenizer, counters, tool_parser=tool_parser)
        if context is not None:
            core.memory_plan = FakePlan(context)  # type: ignore[assignment]
        return core

    return ThreadEngine(load, make_core, capacity=capacity), runners
