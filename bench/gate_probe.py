"""What the speculation gate sees and decides under closed-loop load (a diagnostic).

    python -m bench.gate_probe --model DIR [--mode ngram|predict-edited|draft --draft DIR] [--clients 16] [--rounds 3]

Runs a plain runner and a speculating runner (the gate kept across rounds, as a server keeps
it) on the copy-heavy prompts of bench.speculation, and prints per round: the throughput ratio,
the acceptance, how many steps the gate allowed to speculate, the tokens/s of the steps it timed
under each decision, the share of wall time in steps it did not time (steps that carry a
prefill, and the first step after a change of decision), and its per-bucket rates.
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from typing import Any

from bench.speculation import edited, load_as_served, prompts, run
from engine.batch.runner import BatchRunner
from engine.speculation.rows import Speculation
from engine.types import Request, SamplingParams


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True)
    p.add_argument("--mode", choices=["ngram", "predict-edited", "draft"], default="ngram")
    p.add_argument("--draft", help="the draft model (--mode draft)")
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    model, tokenizer = load_as_served(args.model)
    eos = frozenset(tokenizer.eos_token_ids)
    ids = prompts(tokenizer, 16)
    n = 2 * args.clients
    plain_answers = (  # the predictions are edited plain answers
        run(
            model,
            Speculation(None),
            [Request(f"plain{i}", ids[i], SamplingParams(), args.tokens) for i in range(16)],
            1,
            eos,
        ).tokens
        if args.mode == "predict-edited"
        else {}
    )

    def requests(tag: str, tokens: int, speculating: bool) -> list[Request]:
        out = [Request(f"{tag}{i}", ids[i % 16], SamplingParams(), tokens) for i in range(n)]
        if speculating and args.mode == "predict-edited":
            out = [replace(r, prediction=edited(plain_answers[f"plain{i % 16}"])) for i, r in enumerate(out)]
        return out

    if args.mode == "draft":
        spec = Speculation("draft", 3, load_as_served(args.draft)[0])
    else:
        spec = Speculation("ngram" if args.mode == "ngram" else None, 3)
    runner, plain_runner = BatchRunner(model, speculation=spec), BatchRunner(model)
    decisions: list[bool] = []
    timed: list[tuple[bool, int, float]] = []
    gate = runner.spec.gate
    choose, record = gate.choose, gate.record

    def watched_choose(rows: int) -> bool:
        decisions.append(choose(rows))
        return decisions[-1]

    def watched_record(rows: int, speculated: bool, tokens: int, seconds: float) -> None:
        timed.append((speculated, tokens, seconds))
        record(rows, speculated, tokens, seconds)

    gate.choose, gate.record = watched_choose, watched_record  # type: ignore[method-assign]
    mirrored: list[bool] = []
    mirrors = runner._mirrors

    def watched_mirrors(seq_id: str, rows: int) -> bool:
        mirrored.append(mirrors(seq_id, rows))
        return mirrored[-1]

    runner._mirrors = watched_mirrors  # type: ignore[method-assign]
    run(model, Speculation(None), requests("pw", args.tokens // 2, False), args.clients, eos, plain_runner)
    run(model, spec, requests("w", args.tokens // 2, True), args.clients, eos, runner)

    def rate(rows: list[tuple[bool, int, float]]) -> float:
        return sum(t for _, t, _ in rows) / max(sum(s for _, _, s in rows), 1e-9)

    for k in range(args.rounds):
        plain = run(
            model, Speculation(None), requests("p", args.tokens, False), args.clients, eos, plain_runner
        )
        decisions.clear()
        timed.clear()
        mirrored.clear()
        o: Any = run(model, spec, requests("a", args.tokens, True), args.clients, eos, runner)
        sp, pl = [x for x in timed if x[0]], [x for x in timed if not x[0]]
        ratio = (o.total / o.wall_s) / (plain.total / plain.wall_s)
        untimed = (o.wall_s - sum(s for _, _, s in timed)) / o.wall_s
        print(
            f"round {k}: plain {plain.total / plain.wall_s:.0f} tok/s, {args.mode} {o.total / o.wall_s:.0f} "
            f"({ratio:.2f}x), acceptance {o.acceptance:.2f}; allowed {sum(decisions)}/{len(decisions)} steps; "
            f"timed: speculating {len(sp)} steps at {rate(sp):.0f} tok/s, plain {len(pl)} at {rate(pl):.0f}; "
            f"untimed share of wall {untimed:.2f}"
            + (f"; joins given a draft cache {sum(mirrored)}/{len(mirrored)}" if mirrored else ""),
            flush=True,
        )
        print(
            "  gate tok/s by (bucket, speculating):",
            {key: round(v) for key, v in sorted(gate._rate.items())},
            flush=True,
        )


if __name__ == "__main__":
    main()
