"""Predicted Outputs over HTTP, as a client uses them: re-sending text it knows, or an edited copy.

    python -m bench.predicted_http --model DIR [--tokens 256] [--rounds 5] [--every 10]

Starts mlx-serve on the model and, per prompt (copy-heavy chat requests), asks once greedily for
`--tokens` tokens (the plain answer), then in each round: the plain request again, the same
request with the plain answer as its `prediction` (exact), and with every `--every`-th word of it
replaced (edited, like a file with small changes). Prints per mode the median wall time and its
ratio to plain (medians of per-round ratios), `accepted_prediction_tokens` out of the unchanged
tokens of the prediction, and whether the text equals the plain answer (it must: greedy).
Unchanged tokens: the plain answer's tokens minus those of the replaced words, as the server's
tokenizer counts them. Loopback only.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

import httpx
from transformers import AutoTokenizer

from bench.servers import bench_parser, mlx_serve_running

PROMPTS = (
    "Write a Python module with ten small, documented utility functions for working with strings.",
    "Write a long Python class that implements a bank account with deposits, withdrawals and a history.",
    "Write a detailed README for a command-line tool that renames files in bulk.",
)


def edit(text: str, every: int) -> tuple[str, list[str]]:
    """`text` with every `every`-th word replaced; the replaced words."""
    words, gone = text.split(" "), []
    for i in range(every - 1, len(words), every):
        if words[i].strip():
            gone.append(words[i])
            words[i] = "banana"
    return " ".join(words), gone


MODEL = {"id": ""}


async def ask(
    client: httpx.AsyncClient, prompt: str, tokens: int, prediction: str | None
) -> tuple[float, dict[str, Any]]:
    body: dict[str, Any] = {
        "model": MODEL["id"],
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


async def main(args: argparse.Namespace) -> None:
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    async with (
        mlx_serve_running(args, "predicted-http") as url,
        httpx.AsyncClient(base_url=url, timeout=900) as client,
    ):
        MODEL["id"] = (await client.get("/v1/models")).json()["data"][0]["id"]
        plain: dict[str, str] = {}
        for p in PROMPTS:
            await ask(client, p, 16, None)  # warm-up
            plain[p] = (await ask(client, p, args.tokens, None))[1]["choices"][0]["message"]["content"]
        walls: dict[str, list[float]] = {"plain": [], "exact": [], "edited": []}
        ratios: dict[str, list[float]] = {"exact": [], "edited": []}
        kept: dict[str, list[float]] = {"exact": [], "edited": []}
        same = {"plain": True, "exact": True, "edited": True}
        for _ in range(args.rounds):
            for p in PROMPTS:
                base, again = await ask(client, p, args.tokens, None)
                walls["plain"].append(base)
                same["plain"] = same["plain"] and again["choices"][0]["message"]["content"] == plain[p]
                changed, gone = edit(plain[p], args.every)
                total = len(tokenizer.encode(plain[p], add_special_tokens=False))
                lost = sum(len(tokenizer.encode(" " + w, add_special_tokens=False)) for w in gone)
                for mode, prediction, unchanged in (
                    ("exact", plain[p], total),
                    ("edited", changed, total - lost),
                ):
                    wall, out = await ask(client, p, args.tokens, prediction)
                    walls[mode].append(wall)
                    ratios[mode].append(base / wall)
                    details = out["usage"].get("completion_tokens_details") or {}
                    kept[mode].append(details.get("accepted_prediction_tokens", 0) / max(unchanged, 1))
                    text = out["choices"][0]["message"]["content"]
                    if text != plain[p] and args.show_differences:
                        print(f"  {mode}: {difference(plain[p], text)}; usage {out['usage']}")
                    same[mode] = same[mode] and text == plain[p]
    print(
        f"model {args.model}  {args.tokens} tokens  {len(PROMPTS)} prompts x {args.rounds} rounds  "
        f"edited: every {args.every}th word replaced"
    )
    print(
        f"  plain   median {statistics.median(walls['plain']):.3f} s  "
        f"text of the re-runs {'identical' if same['plain'] else 'DIFFERS'} to the first"
    )
    for mode in ("exact", "edited"):
        r, k = ratios[mode], kept[mode]
        print(
            f"  {mode:<7} median {statistics.median(walls[mode]):.3f} s  {statistics.median(r):.2f}x "
            f"[{min(r):.2f}-{max(r):.2f}]  accepted {statistics.median(k):.2f} of unchanged "
            f"prediction tokens [{min(k):.2f}-{max(k):.2f}]  text {'identical' if same[mode] else 'DIFFERS'} to plain"
        )


def difference(plain: str, text: str) -> str:
    at = next(
        (i for i, (a, b) in enumerate(zip(text, plain, strict=False)) if a != b), min(len(text), len(plain))
    )
    return f"differs at char {at} of {len(plain)}: plain {plain[max(at - 30, 0) : at + 30]!r} vs {text[max(at - 30, 0) : at + 30]!r}"


if __name__ == "__main__":
    parser = bench_parser(__doc__)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--every", type=int, default=10)
    parser.add_argument(
        "--show-differences", action="store_true", help="print where a text first differs from plain"
    )
    asyncio.run(main(parser.parse_args()))
