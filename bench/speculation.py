"""speculation: speculative decoding (prompt lookup, a draft model) and Predicted Outputs.

In process (our scheduler + batch runner, no HTTP, which is the same with or without
speculation), on copy-heavy chat requests: one stream per drafter and γ (decode tok/s, ratio to
plain, acceptance, whether the text equals plain greedy), then closed-loop aggregates at each
client count with vs without speculation, round by round. Drafters: `ngram` (prompt lookup),
`draft` (--draft, or --draft-layers derives one from the target), `-forced` (the gate off),
`predict` (the prediction is the plain answer itself) and `predict-edited` (every 8th token
changed). Then Predicted Outputs over HTTP, as a client sends them (text; see bench.predicted).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
from pathlib import Path
from typing import Any

from bench.common import load_as_served, model_folder

DEFAULTS = {"rounds": 3, "clients": "1,4,16", "max_tokens": 128}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--draft", default=None, help="a draft model folder (same tokenizer)")
    p.add_argument("--draft-layers", default=None, help="derive a draft keeping these target layers (0,1,15)")
    p.add_argument("--gammas", default="1,2,3,4,5", help="draft lengths for the one-stream runs")
    p.add_argument("--agg-gamma", type=int, default=3, help="draft length for the aggregate runs")
    p.add_argument("--modes", default="ngram,draft,draft-forced,predict,predict-edited")
    p.add_argument("--prompts", type=int, default=16, help="distinct prompts (plain answers each once)")
    p.add_argument("--parts", default="stream,aggregate,predicted", help="which parts to run")
    p.add_argument("--every", type=int, default=10, help="Predicted Outputs: replace every Nth word")


def in_process(args: argparse.Namespace, model_dir: Path, parts: list[str]) -> list[str]:
    from bench.speculation_loop import Setup, aggregate_line, derive_draft, prompts, single_stream_line

    model, tokenizer = load_as_served(model_dir)
    if args.draft_layers:
        layers = [int(x) for x in args.draft_layers.split(",")]
        args.draft = str(derive_draft(model_dir, layers, Path("/tmp/mlx-serve-derived-draft")))
    draft = load_as_served(Path(args.draft))[0] if args.draft else None
    modes = [m for m in args.modes.split(",") if not m.startswith("draft") or draft is not None]
    setup = Setup(
        model, draft, frozenset(tokenizer.eos_token_ids), prompts(tokenizer, args.prompts), args.max_tokens
    )
    reference = setup.run("plain", 1, setup.requests(len(setup.ids), "plain"), 1)
    setup.reference = reference.tokens
    setup.run("ngram", 3, setup.requests(4, "warm"), 4)  # compile the verify shapes
    out = [f"model {model_dir}; draft {args.draft}; {args.max_tokens} tokens a request"]
    if "stream" in parts:
        runs = [setup.run("plain", 1, setup.requests(2, "p"), 1).decode_rates for _ in range(args.rounds)]
        plain_rate = statistics.median(statistics.median(r) for r in runs)
        out += [
            "\none stream (decode tok/s, median of rounds; ratio to plain)",
            f"  plain            {plain_rate:8.1f} tok/s",
        ]
        for mode in modes:
            # a prediction's draft length is its own (engine.speculation.drafting): γ is moot
            for gamma in (
                [args.agg_gamma] if mode.startswith("predict") else [int(g) for g in args.gammas.split(",")]
            ):
                out.append(single_stream_line(setup, mode, gamma, args.rounds, plain_rate))
                print(out[-1], flush=True)
    if "aggregate" in parts:
        out.append(
            f"\naggregate (closed loop, γ={args.agg_gamma}; tok/s and ratio to plain, median of rounds)"
        )
        for c in [int(c) for c in args.clients.split(",")]:
            out.append(aggregate_line(setup, modes, args.agg_gamma, c, args.rounds))
            print(out[-1], flush=True)
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    from dataclasses import asdict

    from bench.machine import describe
    from bench.predicted import lines, predicted_outputs

    model_dir = model_folder(args.model)
    parts = args.parts.split(",")
    report = in_process(args, model_dir, parts) if {"stream", "aggregate"} & set(parts) else []
    predicted = asyncio.run(predicted_outputs(args, model_dir)) if "predicted" in parts else None
    machine = describe()
    print(f"\n{machine.line()}")
    print("\n".join(report + (lines(predicted, args.every) if predicted else [])), flush=True)
    return {"machine": asdict(machine), "in_process": report, "predicted": predicted}
