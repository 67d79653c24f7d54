"""Predicted Outputs over HTTP, as a client uses them: re-sending text it knows, or an edited copy.

Per prompt (open-ended code and prose), mlx-serve answers once greedily (the plain answer); then
each round sends the plain request again, the same with the plain answer as `prediction`
(exact) and with every --every-th word of it replaced (edited, like a file with small changes).
Per mode: the median wall time and its ratio to plain (medians of per-round ratios),
`accepted_prediction_tokens` over the prediction's unchanged tokens (the answer's tokens less
the replaced words', as the model's tokenizer counts them: approximate), and whether every text
equalled the plain answer (it must: greedy).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

import httpx

from bench.common import REQUEST_MODEL, log_dir, server_spec, serving

PROMPTS = (
    "Write a Python module with ten small, documented utility functions for working with strings.",
    "Write a long Python class that implements a bank account with deposits, withdrawals and a history.",
    "Write a detailed README for a command-line tool that renames files in bulk.",
)
MODES = ("exact", "edited")


def edit(text: str, every: int) -> tuple[str, list[str]]:
    """`text` with every `every`-th word replaced; the replaced words."""
    words, gone = text.split(" "), []
    for i in range(every - 1, len(words), every):
        if words[i].strip():
            gone.append(words[i])
            words[i] = "banana"
    return " ".join(words), gone


async def ask(
    client: httpx.AsyncClient, prompt: str, tokens: int, prediction: str | None
) -> tuple[float, dict[str, Any]]:
    body: dict[str, Any] = {
        "model": REQUEST_MODEL,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": tokens,
        "temperature": 0,
    }
    if prediction is not None:
        body["prediction"] = {"type": "content", "content": prediction}
    began = time.perf_counter()
    r = await client.post("/v1/chat/completions", json=body)
    r.raise_for_status()
    return time.perf_counter() - began, r.json()


def text_of(answer: dict[str, Any]) -> str:
    return str(answer["choices"][0]["message"]["content"])


async def predicted_outputs(args: argparse.Namespace, model: Path) -> dict[str, Any]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model))
    logs = log_dir(args, "predicted")
    walls: dict[str, list[float]] = {"plain": [], "exact": [], "edited": []}
    ratios: dict[str, list[float]] = {m: [] for m in MODES}
    kept: dict[str, list[float]] = {m: [] for m in MODES}
    same = dict.fromkeys(walls, True)
    spec = server_spec(args, "mlx-serve", model, logs)
    async with (
        serving(spec, logs / "mlx-serve.log", args.startup_timeout) as server,
        httpx.AsyncClient(base_url=server.base_url, timeout=args.startup_timeout) as client,
    ):
        plain = {p: text_of((await ask(client, p, args.max_tokens, None))[1]) for p in PROMPTS}
        for _ in range(args.rounds):
            for p in PROMPTS:
                base, again = await ask(client, p, args.max_tokens, None)
                walls["plain"].append(base)
                same["plain"] &= text_of(again) == plain[p]
                changed, gone = edit(plain[p], args.every)
                total = len(tokenizer.encode(plain[p], add_special_tokens=False))
                lost = sum(len(tokenizer.encode(" " + w, add_special_tokens=False)) for w in gone)
                for mode, prediction, unchanged in (
                    ("exact", plain[p], total),
                    ("edited", changed, total - lost),
                ):
                    wall, out = await ask(client, p, args.max_tokens, prediction)
                    walls[mode].append(wall)
                    ratios[mode].append(base / wall)
                    details = out["usage"].get("completion_tokens_details") or {}
                    kept[mode].append(details.get("accepted_prediction_tokens", 0) / max(unchanged, 1))
                    same[mode] &= text_of(out) == plain[p]
    return {"walls": walls, "speedups": ratios, "accepted_share": kept, "identical": same}


def lines(result: dict[str, Any], every: int) -> list[str]:
    walls, same = result["walls"], result["identical"]
    out = [
        f"\nPredicted Outputs over HTTP (mlx-serve; edited: every {every}th word replaced)",
        f"  plain   median {statistics.median(walls['plain']):.3f} s  re-runs {'identical' if same['plain'] else 'DIFFER'}",
    ]
    for mode in MODES:
        r, k = result["speedups"][mode], result["accepted_share"][mode]
        out.append(
            f"  {mode:<7} median {statistics.median(walls[mode]):.3f} s  {statistics.median(r):.2f}x faster "
            f"[{min(r):.2f}-{max(r):.2f}]  accepted {statistics.median(k):.2f} of unchanged prediction tokens  "
            f"text {'identical' if same[mode] else 'DIFFERS'} to plain"
        )
    return out
