"""Speculative decoding in process: our scheduler + batch runner, with and without speculation.

The workload is copy-heavy chat requests (rewrite a given file or list with one small change),
the cases prompt lookup and Predicted Outputs are for. Everything runs in one process on the
same prompts, so ratios compare like with like.
"""

from __future__ import annotations

import json
import shutil
import statistics
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import mlx.core as mx

from mlx_serve.engine.batch.runner import BatchRunner
from mlx_serve.engine.batch.scheduler import Scheduler, SchedulerConfig
from mlx_serve.engine.speculation.rows import Speculation
from mlx_serve.engine.types import Request, SamplingParams

FILES = (
    (
        "def area(width, height):\n    result = width * height\n    return result\n\n"
        "def perimeter(width, height):\n    result = 2 * (width + height)\n    return result\n\n"
        "def describe(width, height):\n    return f'{width} by {height}: area {area(width, height)}'\n"
    ),
    (
        "Shopping list: apples, oranges, pears, plums, grapes, cherries, bread, butter, milk, eggs, "
        "cheese, rice, beans, lentils, tomatoes, onions, garlic, basil, olive oil, salt, pepper."
    ),
    (
        "class Counter:\n    def __init__(self):\n        self.count = 0\n\n    def add(self, n):\n"
        "        self.count += n\n        return self.count\n\n    def reset(self):\n        self.count = 0\n"
    ),
    (
        "The meeting is on Monday at 10am in room 4. Bring the quarterly report, the budget sheet and "
        "the list of open issues. Anna presents sales, Ben presents support, Carla presents hiring."
    ),
)
ASKS = (
    "Rewrite this exactly, but rename `result` to `value`:",
    "Repeat this list exactly:",
    "Copy this code exactly, adding nothing:",
    "Repeat this note word for word:",
)


@dataclass(slots=True)
class Outcome:
    tokens: dict[str, list[int]] = field(default_factory=dict)
    decode_rates: list[float] = field(default_factory=list)
    wall_s: float = 0.0
    drafted: int = 0
    accepted: int = 0

    @property
    def total(self) -> int:
        return sum(len(t) for t in self.tokens.values())

    @property
    def acceptance(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0


def prompts(tokenizer: Any, count: int) -> list[tuple[int, ...]]:
    out = []
    for i in range(count):
        text = f"{ASKS[i % len(ASKS)]}\n\n{FILES[i % len(FILES)]}"
        out.append(
            tuple(
                tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)
            )
        )
    return out


def closed_loop(
    model: Any,
    spec: Speculation,
    requests: list[Request],
    clients: int,
    eos: frozenset[int],
    runner: BatchRunner | None = None,
) -> Outcome:
    """Closed loop: `clients` requests in flight until every request has finished. A runner
    passed in keeps what its speculation gate learned before (as a running server's does)."""
    sched = Scheduler(
        SchedulerConfig(
            max_running=max(clients, 1),
            token_budget=2048,
            draft_tokens=spec.num_draft_tokens if spec.kind else 0,
        ),
        eos,
    )
    runner = runner if runner is not None else BatchRunner(model, speculation=spec)
    todo, out = list(requests), Outcome()
    first: dict[str, float] = {}
    start = time.perf_counter()
    while todo or sched.has_work:
        while todo and sched.num_active + len(sched.waiting) < clients:
            r = todo.pop(0)
            sched.add(r)
            out.tokens[r.id] = []
        plan = sched.schedule()
        for sid in plan.admitted:
            runner.admit(sched.get(sid).request)  # type: ignore[union-attr]
        step = runner.step(plan)
        now = time.perf_counter()
        for d, a in step.speculation.values():
            out.drafted, out.accepted = out.drafted + d, out.accepted + a
        for u in sched.update(plan, step):
            out.tokens[u.seq_id].append(u.token)
            first.setdefault(u.seq_id, now)
            if u.finish is not None and u.num_generated > 1:
                out.decode_rates.append((u.num_generated - 1) / max(now - first[u.seq_id], 1e-9))
    out.wall_s = time.perf_counter() - start
    return out


def edited(tokens: list[int], every: int = 8) -> tuple[int, ...]:
    return tuple(t if (i + 1) % every else (t + 7) % 32000 for i, t in enumerate(tokens))


def derive_draft(target: Path, layers: list[int], out: Path) -> Path:
    """A draft that is the target with only `layers` kept (same embeddings, head, tokenizer)."""
    config = json.loads((target / "config.json").read_text())
    weights: dict[str, mx.array] = {}
    for f in sorted(target.glob("*.safetensors")):
        weights.update(mx.load(str(f)))  # type: ignore[arg-type]  # a .safetensors file loads as a dict
    renumber = {old: new for new, old in enumerate(layers)}
    kept = {}
    for k, v in weights.items():
        parts = k.split(".")
        if "layers" in parts:
            at = parts.index("layers") + 1
            if int(parts[at]) not in renumber:
                continue
            parts[at] = str(renumber[int(parts[at])])
        kept[".".join(parts)] = v
    out.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(out / "model.safetensors"), kept)
    config["num_hidden_layers"] = len(layers)
    (out / "config.json").write_text(json.dumps(config))
    for f in target.iterdir():
        if f.suffix != ".safetensors" and f.name not in ("config.json", "model.safetensors.index.json"):
            shutil.copy(f, out / f.name)
    return out


@dataclass(slots=True)
class Setup:
    """The model, its draft, the prompts and the plain greedy answers every mode is checked against."""

    model: Any
    draft: Any
    eos: frozenset[int]
    ids: list[tuple[int, ...]]
    tokens: int
    reference: dict[str, list[int]] = field(default_factory=dict)

    def requests(self, n: int, tag: str, mode: str = "") -> list[Request]:
        out = []
        for i in range(n):
            r = Request(f"{tag}{i}", self.ids[i % len(self.ids)], SamplingParams(), self.tokens)
            if mode.startswith("predict"):
                answer = self.reference[f"plain{i % len(self.ids)}"]
                r = replace(r, prediction=tuple(answer) if mode == "predict" else edited(answer))
            out.append(r)
        return out

    def speculation(self, mode: str, gamma: int) -> Speculation:
        """`-forced`: the gate off, so every step speculates whatever it costs."""
        kind = mode.removesuffix("-forced")
        if kind in ("ngram", "draft"):
            return Speculation(kind, gamma, self.draft if kind == "draft" else None, gated=mode == kind)
        return Speculation(None, gamma)  # plain; predictions draft for themselves

    def run(
        self, mode: str, gamma: int, requests: list[Request], clients: int, runner: BatchRunner | None = None
    ) -> Outcome:
        return closed_loop(self.model, self.speculation(mode, gamma), requests, clients, self.eos, runner)


def single_stream_line(setup: Setup, mode: str, gamma: int, runs: int, plain_rate: float) -> str:
    """One mode at one γ, one stream: decode rate, ratio to plain, acceptance, identical output."""
    rates, acc, kept, same = [], [], [], True
    answers = [setup.reference[f"plain{i}"] for i in range(2)]
    unchanged = sum(len(a) if mode == "predict" else len(a) - len(a) // 8 for a in answers)
    for _ in range(runs):
        o = setup.run(mode, gamma, setup.requests(2, "s", mode), 1)
        same = same and all(o.tokens[f"s{i}"] == answers[i] for i in range(2))
        rates.append(statistics.median(o.decode_rates))
        acc.append(o.acceptance)
        kept.append(o.accepted / max(unchanged, 1))
    r = statistics.median(rates)
    share = (
        f"  {statistics.median(kept):.2f} of unchanged tokens accepted" if mode.startswith("predict") else ""
    )
    return (
        f"  {mode:<14} γ={gamma} {r:8.1f} tok/s  {r / plain_rate:5.2f}x  acceptance "
        f"{statistics.median(acc):.2f}{share}  output {'identical' if same else 'DIFFERS'} to plain"
    )


def aggregate_line(setup: Setup, modes: list[str], gamma: int, clients: int, rounds: int) -> str:
    """Closed loop at `clients`: total tok/s per mode and its ratio to plain, round by round."""
    n = max(2 * clients, 4)
    # An untimed warm-up per mode on the runner its timed runs use: first use of a shape compiles
    # kernels on a GPU, and the gate starts with what it learned (as a loaded server's has).
    runners = {}
    for mode in ["plain", *modes]:
        runners[mode] = BatchRunner(setup.model, speculation=setup.speculation(mode, gamma))
        short = [replace(r, max_tokens=max(setup.tokens // 2, 8)) for r in setup.requests(n, "w", mode)]
        setup.run(mode, gamma, short, clients, runners[mode])
    rates: dict[str, list[float]] = {m: [] for m in ["plain", *modes]}
    ratios: dict[str, list[float]] = {m: [] for m in modes}
    accepted: dict[str, list[float]] = {m: [] for m in modes}
    for _ in range(rounds):
        for mode in ["plain", *modes]:
            o = setup.run(mode, gamma, setup.requests(n, "a", mode), clients, runners[mode])
            rates[mode].append(o.total / o.wall_s)
            if mode != "plain":
                ratios[mode].append(rates[mode][-1] / rates["plain"][-1])
                accepted[mode].append(o.acceptance)
    line = f"  {clients:>3} clients  plain {statistics.median(rates['plain']):8.1f}"
    for mode in modes:
        spread = f" [{min(ratios[mode]):.2f}-{max(ratios[mode]):.2f}]" if rounds > 1 else ""
        line += (
            f" | {mode} {statistics.median(rates[mode]):8.1f} ({statistics.median(ratios[mode]):4.2f}x"
            f"{spread}, acc {statistics.median(accepted[mode]):.2f})"
        )
    return line
