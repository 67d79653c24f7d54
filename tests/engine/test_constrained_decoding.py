"""Tier 3, engine level: grammars enforced inside the continuous batch, on a real (tiny, random)
model through the real core, runner and scheduler.

A random model writes nonsense, which is the point: whatever it would write, the grammar
decides what comes out. Every schema here is bounded, so every row must end by the grammar
(`stop`) well before max_tokens.
"""

from __future__ import annotations

import json
import math
import queue
import threading
from pathlib import Path
from typing import Any

import pytest

from mlx_serve.engine.batch.core import Core
from mlx_serve.engine.batch.core_parts import Ticket
from mlx_serve.engine.batch.runner import BatchRunner
from mlx_serve.engine.batch.scheduler import Scheduler, SchedulerConfig
from mlx_serve.engine.errors import InvalidRequest, ServeError
from mlx_serve.engine.types import (
    Admitted,
    Counters,
    Event,
    Finished,
    FinishReason,
    Request,
    SamplingParams,
    TextDelta,
    ToolCallArgsDelta,
    ToolCallStart,
)
from mlx_serve.protocols import structured
from tests.support.json_check import errors

SCHEMAS: list[dict[str, Any]] = [
    {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 12},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
        },
        "required": ["name", "age"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {
            "color": {"enum": ["red", "green", "blue"]},
            "size": {"enum": [1, 2, 3]},
            "kind": {"const": "shirt"},
        },
        "required": ["color", "size", "kind"],
        "additionalProperties": False,
    },
    {
        "type": "array",
        "items": {"type": "integer", "minimum": -50, "maximum": 50},
        "minItems": 1,
        "maxItems": 4,
    },
    {
        "type": "object",
        "properties": {
            "price": {"type": "number", "minimum": 0, "maximum": 99, "multipleOf": 0.25},
            "delta": {"type": "number", "minimum": -1, "maximum": 1, "multipleOf": 0.5},
        },
        "required": ["price", "delta"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {
            "point": {
                "type": "object",
                "properties": {
                    "ok": {"type": "boolean"},
                    "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3},
                    "id": {
                        "anyOf": [
                            {"type": "integer", "minimum": 0, "maximum": 9},
                            {"type": "string", "pattern": "^[a-z]{2}$"},
                        ]
                    },
                },
                "required": ["ok", "tags", "id"],
                "additionalProperties": False,
            },
            "note": {"type": "string", "maxLength": 5},
        },
        "required": ["point"],
        "additionalProperties": False,
    },
]
WEATHER: Any = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"enum": ["Paris", "Rome"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
            },
            "required": ["city", "days"],
            "additionalProperties": False,
        },
    },
}
CLOCK: Any = {
    "type": "function",
    "function": {
        "name": "now",
        "parameters": {
            "type": "object",
            "properties": {"tz": {"enum": ["UTC", "CET"]}},
            "required": ["tz"],
            "additionalProperties": False,
        },
    },
}


@pytest.fixture(scope="module")
def tiny(tiny_path: Path) -> tuple[Any, Any]:
    from mlx_lm import load

    return load(str(tiny_path))


def make_core(tiny: tuple[Any, Any]) -> Core:
    model, tokenizer = tiny
    scheduler = Scheduler(SchedulerConfig(), frozenset(tokenizer.eos_token_ids))
    return Core(scheduler, BatchRunner(model), tokenizer, Counters())


def run(core: Core, requests: list[Request]) -> dict[str, list[Event | ServeError]]:
    """Serve the requests together (one batch) until each has finished or failed."""
    inbox: queue.SimpleQueue[Ticket | None] = queue.SimpleQueue()
    got: dict[str, list[Event | ServeError]] = {r.id: [] for r in requests}
    done = threading.Semaphore(0)

    def emitter(rid: str) -> Any:
        def emit(ev: Event | Admitted | ServeError) -> None:
            if isinstance(ev, Admitted):  # the server's note of what was cached, not an event
                return
            got[rid].append(ev)
            if isinstance(ev, Finished | ServeError):
                done.release()

        return emit

    for r in requests:
        inbox.put(Ticket(r, emitter(r.id)))
    thread = threading.Thread(target=core.serve, args=(inbox,), daemon=True)
    thread.start()
    for _ in requests:
        assert done.acquire(timeout=300)
    inbox.put(None)
    thread.join(30)
    return got


def text(events: list[Event | ServeError]) -> str:
    return "".join(e.text for e in events if isinstance(e, TextDelta))


def deltas(events: list[Event | ServeError]) -> list[Event | ServeError]:
    return [e for e in events if not isinstance(e, Finished)]


def finish(events: list[Event | ServeError]) -> FinishReason:
    last = events[-1]
    assert isinstance(last, Finished), last
    return last.reason


def prompt(tokenizer: Any, question: str) -> tuple[int, ...]:
    return tuple(
        tokenizer.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True)
    )


def test_checker_catches_what_the_tests_rely_on() -> None:
    assert errors({"name": "x" * 13, "age": 7}, SCHEMAS[0])
    assert errors({"color": "red", "size": 1, "kind": "shirt", "x": 0}, SCHEMAS[1])
    assert errors([], SCHEMAS[2]) and errors([51], SCHEMAS[2])
    assert errors({"price": 1.3, "delta": 0.5}, SCHEMAS[3]) and errors({"price": 100, "delta": 0}, SCHEMAS[3])
    assert not errors({"price": 98.75, "delta": -1}, SCHEMAS[3])
    assert errors({"point": {"ok": True, "tags": ["c"], "id": "abc"}}, SCHEMAS[4])
    assert not errors({"point": {"ok": False, "tags": [], "id": "ab"}, "note": "hi"}, SCHEMAS[4])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sampled_rows_with_different_schemas_in_one_batch_all_follow_their_schema(
    tiny: tuple[Any, Any], seed: int
) -> None:
    core = make_core(tiny)
    ids = prompt(tiny[1], "Describe something as JSON.")
    requests = [
        Request(
            f"s{i}",
            ids,
            SamplingParams(temperature=1.0, seed=seed * 100 + i),
            120,
            grammar=structured.json_schema(schema, "p"),
        )
        for i, schema in enumerate(SCHEMAS)
    ]
    got = run(core, requests)
    for i, schema in enumerate(SCHEMAS):
        events = got[f"s{i}"]
        assert finish(events) is FinishReason.STOP, text(events)
        assert errors(json.loads(text(events)), schema) == [], text(events)


def test_free_rows_beside_constrained_rows_are_unchanged(tiny: tuple[Any, Any]) -> None:
    ids = prompt(tiny[1], "Tell me a story.")
    free = Request("free", ids, SamplingParams(), 24)
    alone = run(make_core(tiny), [free])["free"]
    mixed = run(
        make_core(tiny),
        [
            Request("json", ids, SamplingParams(), 60, grammar=structured.json_schema(SCHEMAS[1], "p")),
            free,
            Request("choice", ids, SamplingParams(), 10, grammar=structured.choice(["yes", "no"], "p")),
        ],
    )
    assert deltas(mixed["free"]) == deltas(alone) and finish(alone) is FinishReason.LENGTH
    assert text(mixed["choice"]) in ("yes", "no") and finish(mixed["choice"]) is FinishReason.STOP
    assert not errors(json.loads(text(mixed["json"])), SCHEMAS[1])


def calls(events: list[Event | ServeError]) -> list[tuple[str, Any]]:
    names = {e.index: e.name for e in events if isinstance(e, ToolCallStart)}
    args: dict[int, str] = {}
    for e in events:
        if isinstance(e, ToolCallArgsDelta):
            args[e.index] = args.get(e.index, "") + e.arguments
    return [(names[i], json.loads(args[i])) for i in sorted(names)]


def test_forced_tool_calls_come_back_as_tool_calls(tiny: tuple[Any, Any]) -> None:
    ids = prompt(tiny[1], "What's the weather?")
    tools = (WEATHER, CLOCK)

    def forced(rid: str, name: str | None, seed: int) -> Request:
        grammar = structured.forced_calls(tools, name, True, rid == "parallel")
        return Request(
            rid,
            ids,
            SamplingParams(temperature=1.0, seed=seed),
            80,
            tools=tools,
            grammar=grammar,
            forced_tool_calls=True,
        )

    got = run(
        make_core(tiny),
        [
            forced("named", "now", 1),
            forced("any-1", None, 2),
            forced("any-2", None, 3),
            forced("parallel", None, 4),
        ],
    )
    for rid, events in got.items():
        made = calls(events)
        for name, arguments in made:
            assert rid != "named" or name == "now"
            schema = (WEATHER if name == "get_weather" else CLOCK)["function"]["parameters"]
            assert errors(arguments, schema) == []
        if rid == "parallel":  # calls until the model stops or max_tokens cuts the last one
            assert len(made) >= 1 and finish(events) in (FinishReason.TOOL_CALLS, FinishReason.LENGTH)
        else:
            assert (len(made), text(events), finish(events)) == (1, "", FinishReason.TOOL_CALLS)


def test_a_grammar_the_engine_cannot_build_fails_only_its_own_request(tiny: tuple[Any, Any]) -> None:
    ids = prompt(tiny[1], "Hi")
    bad = Request("bad", ids, grammar=structured.grammar("start: <|no_such_token|>", "p"))
    got = run(make_core(tiny), [bad, Request("ok", ids, SamplingParams(), 4)])
    (error,) = got["bad"]
    assert isinstance(error, InvalidRequest) and "unknown special token" in error.message
    assert finish(got["ok"]) is FinishReason.LENGTH


def test_log_probabilities_under_a_grammar_leave_out_forbidden_tokens(tiny: tuple[Any, Any]) -> None:
    ids = prompt(tiny[1], "Yes or no?")
    request = Request(
        "lp", ids, SamplingParams(), 10, logprobs=5, grammar=structured.choice(["yes", "no"], "p")
    )
    events = run(make_core(tiny), [request])["lp"]
    entries = [t for e in events if isinstance(e, TextDelta) for t in e.logprobs]
    assert entries and text(events) in ("yes", "no")
    for entry in entries:
        assert math.isfinite(entry.logprob) and entry.top
        assert all(math.isfinite(v) for _, v in entry.top), entry.top


def test_constrained_rows_share_a_batch_with_speculating_rows(tiny: tuple[Any, Any]) -> None:
    """Constrained rows do not speculate, but they ride in the speculative verify forward of the
    rows that do (here: rows with a prediction of their own text): each matcher must still see
    each token once, and the speculating rows keep their plain text."""
    from dataclasses import replace

    model, tokenizer = tiny
    free = [
        Request(f"free{i}", prompt(tokenizer, q), SamplingParams(), 40)
        for i, q in enumerate(["a b c a b c a b c", "one two one two one two"])
    ]
    plain = run(make_core(tiny), free)
    said = {
        r.id: tuple(t for e in plain[r.id] if isinstance(e, TextDelta) for t in e.token_ids) for r in free
    }
    assert all(said.values())
    predicted = [replace(r, prediction=said[r.id]) for r in free]
    ids = prompt(tokenizer, "Describe something as JSON.")
    shaped = [
        Request(
            f"json{i}",
            ids,
            SamplingParams(temperature=1.0, seed=i),
            120,
            grammar=structured.json_schema(s, "response_format"),
        )
        for i, s in enumerate(SCHEMAS[:3])
    ]
    from mlx_serve.engine.speculation.rows import Speculation

    scheduler = Scheduler(SchedulerConfig(draft_tokens=3), frozenset(tokenizer.eos_token_ids))
    runner = BatchRunner(model, speculation=Speculation(None, 3, gated=False))
    core = Core(scheduler, runner, tokenizer, Counters())
    got = run(core, [*predicted, *shaped])
    for i, s in enumerate(SCHEMAS[:3]):
        assert finish(got[f"json{i}"]) is FinishReason.STOP
        assert errors(json.loads(text(got[f"json{i}"])), s) == []
    assert core.counters.spec_decode_num_accepted_tokens > 0
    for r in free:
        assert text(got[r.id]) == text(plain[r.id])
