"""Speculative decoding, in process: our scheduler + batch runner with and without speculation.

    python -m bench.speculation --model DIR [--draft DIR | --draft-layers 0,1,15]
        [--tokens 128] [--gammas 1,2,3,4,5] [--clients 1,4,16] [--runs 3]

Workload: copy-heavy chat requests (rewrite a given file or list with one small change), the
cases prompt lookup and Predicted Outputs are for. Every mode runs in this one process on the
same prompts, so the printed ratios compare like with like:
  - single stream: decode tok/s (after the first token) per drafter and γ, median of --runs,
    as a ratio to plain decoding, with the acceptance rate seen;
  - aggregate: closed-loop clients (each sends its next request when one ends), total tok/s
    over the wall time, with vs without speculation (γ = --agg-gamma).
Drafters: `ngram` (prompt lookup; `ngram-forced` with the gate off), `draft` (a draft model: --draft, or --draft-layers derives
one from the target by keeping those layers), `predict` (the client's prediction is the plain
output itself: the best case, e.g. re-sending known text) and `predict-edited` (that output with
every 8th token changed, like an edited file).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import mlx.core as mx
from mlx_lm import load

from engine.batch.runner import BatchRunner
from engine.batch.scheduler import Scheduler, SchedulerConfig
from engine.speculation.rows import Speculation
from engine.types import Request, SamplingParams

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


def load_as_served(path: str) -> tuple[Any, Any]:
    """Model and tokenizer as the server runs them: its attention choice on MLX's CUDA backend
    (engine.model.backend) and its weight dtype (engine.model.loader.maybe_dequantize)."""
    from engine.model.backend import prefer_shape_free_attention
    from engine.model.loader import maybe_dequantize

    prefer_shape_free_attention()
    model, tokenizer = load(path)
    return maybe_dequantize(model), tokenizer


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


def run(
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
        weights.update(mx.load(str(f)))
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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True)
    p.add_argument("--draft")
    p.add_argument(
        "--draft-layers", help="derive a draft from the target, keeping these layers (e.g. 0,1,15)"
    )
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--gammas", default="1,2,3,4,5")
    p.add_argument("--clients", default="1,4,16")
    p.add_argument("--agg-gamma", type=int, default=3)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--modes", default="ngram,draft,draft-forced,predict,predict-edited")
    p.add_argument(
        "--prompts", type=int, default=16, help="distinct prompts (the plain reference answers each)"
    )
    p.add_argument("--aggregate-only", action="store_true")
    p.add_argument(
        "--agg-runs",
        type=int,
        default=1,
        help="aggregate rounds (plain then every mode); medians of the per-round ratios",
    )
    args = p.parse_args()
    model, tokenizer = load_as_served(args.model)
    draft = None
    if args.draft_layers:
        layers = [int(x) for x in args.draft_layers.split(",")]
        args.draft = str(derive_draft(Path(args.model), layers, Path("/tmp/mlx-serve-derived-draft")))
    if args.draft:
        draft = load_as_served(args.draft)[0]
    modes = [m for m in args.modes.split(",") if not m.startswith("draft") or draft is not None]
    eos = frozenset(tokenizer.eos_token_ids)
    gammas = [int(g) for g in args.gammas.split(",")]
    ids = prompts(tokenizer, args.prompts)
    print(f"device {mx.default_device()}  model {args.model}  draft {args.draft}  tokens {args.tokens}")

    def requests(
        n: int, tag: str, plain: dict[str, list[int]] | None = None, mode: str = "", gamma: int = 3
    ) -> list[Request]:
        out = []
        for i in range(n):
            r = Request(f"{tag}{i}", ids[i % len(ids)], SamplingParams(), args.tokens)
            if mode.startswith("predict") and plain is not None:
                answer = plain[f"plain{i % len(ids)}"]
                r = replace(r, prediction=tuple(answer) if mode == "predict" else edited(answer))
            out.append(r)
        return out

    def spec_for(mode: str, gamma: int) -> Speculation:
        if mode == "plain":
            return Speculation(None, gamma)
        if mode == "ngram":
            return Speculation("ngram", gamma)
        if mode == "ngram-forced":  # the gate off: what speculating on every step costs or brings
            return Speculation("ngram", gamma, gated=False)
        if mode == "draft":
            return Speculation("draft", gamma, draft)
        if mode == "draft-forced":  # the gate off: every step speculates, whatever it costs
            return Speculation("draft", gamma, draft, gated=False)
        return Speculation(None, gamma)  # predictions draft for themselves

    reference = run(model, Speculation(None), requests(len(ids), "plain"), 1, eos)
    run(model, Speculation("ngram", 3), requests(4, "warm"), 4, eos)  # compile the verify shapes
    # single stream
    print("\nsingle stream (decode tok/s, median of runs; ratio to plain; acceptance)")
    base = []
    for _ in range(args.runs):
        base.append(statistics.median(run(model, Speculation(None), requests(2, "p"), 1, eos).decode_rates))
    plain_rate = statistics.median(base)
    print(f"  plain            {plain_rate:8.1f} tok/s")
    for mode in [] if args.aggregate_only else modes:
        # A prediction's draft length is its own (engine.speculation.drafting.PREDICTION_K): γ is moot.
        for gamma in gammas if not mode.startswith("predict") else [args.agg_gamma]:
            rates, acc, kept, same = [], [], [], True
            for _ in range(args.runs):
                o = run(model, spec_for(mode, gamma), requests(2, "s", reference.tokens, mode, gamma), 1, eos)
                same = same and all(o.tokens[f"s{i}"] == reference.tokens[f"plain{i}"] for i in range(2))
                rates.append(statistics.median(o.decode_rates))
                acc.append(o.acceptance)
                answers = [reference.tokens[f"plain{i}"] for i in range(2)]
                unchanged = sum(len(a) if mode == "predict" else len(a) - len(a) // 8 for a in answers)
                kept.append(o.accepted / unchanged)
            r = statistics.median(rates)
            share = (
                f"  {statistics.median(kept):.2f} of unchanged tokens accepted"
                if mode.startswith("predict")
                else ""
            )
            print(
                f"  {mode:<14} γ={gamma} {r:8.1f} tok/s  {r / plain_rate:5.2f}x  acceptance "
                f"{statistics.median(acc):.2f}{share}  output {'identical' if same else 'DIFFERS'} to plain",
                flush=True,
            )
    # aggregate
    print(
        f"\naggregate (closed loop, {args.tokens} tokens/request, γ={args.agg_gamma}; tok/s and ratio to plain)"
    )
    for clients in [int(c) for c in args.clients.split(",")]:
        n = max(2 * clients, 4)
        # An untimed warm-up per mode, on the runner the timed run then uses: first use of a shape
        # compiles kernels on a GPU, and the gate starts the timed run with what it learned (a
        # server under steady load has long since learned it).
        runners = {}
        for mode in ["plain", *modes]:
            runners[mode] = BatchRunner(model, speculation=spec_for(mode, args.agg_gamma))
            short = [
                replace(r, max_tokens=max(args.tokens // 2, 8))
                for r in requests(n, "w", reference.tokens, mode)
            ]
            run(model, spec_for(mode, args.agg_gamma), short, clients, eos, runners[mode])
        # Rounds: plain, then every mode, again and again; each round's ratios are to its own
        # plain run, and the medians are reported (a shared GPU host drifts by tens of percent).
        rates: dict[str, list[float]] = {m: [] for m in ["plain", *modes]}
        ratios: dict[str, list[float]] = {m: [] for m in modes}
        accepted: dict[str, list[float]] = {m: [] for m in modes}
        for _ in range(args.agg_runs):
            plain = run(model, Speculation(None), requests(n, "a"), clients, eos, runners["plain"])
            rates["plain"].append(plain.total / plain.wall_s)
            for mode in modes:
                o = run(
                    model,
                    spec_for(mode, args.agg_gamma),
                    requests(n, "a", reference.tokens, mode),
                    clients,
                    eos,
                    runners[mode],
                )
                rates[mode].append(o.total / o.wall_s)
                ratios[mode].append(rates[mode][-1] / rates["plain"][-1])
                accepted[mode].append(o.acceptance)
        line = f"  {clients:>3} clients  plain {statistics.median(rates['plain']):8.1f}"
        for mode in modes:
            spread = f" [{min(ratios[mode]):.2f}-{max(ratios[mode]):.2f}]" if args.agg_runs > 1 else ""
            line += (
                f" | {mode} {statistics.median(rates[mode]):8.1f} ({statistics.median(ratios[mode]):4.2f}x"
                f"{spread}, acc {statistics.median(accepted[mode]):.2f})"
            )
        print(line, flush=True)


if __name__ == "__main__":
    main()
