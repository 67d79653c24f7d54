"""Diagnose slow speculative steps: per-step time with the batch and draft shapes (GPU runs)."""

from __future__ import annotations

import sys
import time

from bench.speculation import Request, SamplingParams, Speculation, load, prompts, run
from engine.batch.runner import BatchRunner
from engine.speculation import draft_model as S


def main() -> None:
    model, tok = load(sys.argv[1])
    draft = load(sys.argv[2])[0]
    ids = prompts(tok, 16)
    eos = frozenset(tok.eos_token_ids)
    shapes: list[tuple[int, int, int]] = []
    orig = S.DraftRows.draft

    def spy(self, h, p, k):  # type: ignore[no-untyped-def]
        miss = [len(x) - s for x, s in zip(h, self.seen)]
        shapes.append((len(h), max(miss), 1 << max(miss).bit_length()))
        return orig(self, h, p, k)

    S.DraftRows.draft = spy
    steps: list[tuple[float, bool, tuple[int, int, int] | None]] = []
    step = BatchRunner.step

    def timed(self, plan):  # type: ignore[no-untyped-def]
        n = len(shapes)
        t = time.perf_counter()
        out = step(self, plan)
        steps.append(
            (time.perf_counter() - t, bool(out.speculation), shapes[-1] if len(shapes) > n else None)
        )
        return out

    BatchRunner.step = timed
    for clients in (1, 4):
        for kind in ("plain", "draft"):
            spec = Speculation(None) if kind == "plain" else Speculation("draft", 3, draft)
            for rep in range(2):
                steps.clear()
                reqs = [Request(f"a{i}", ids[i % 16], SamplingParams(), 64) for i in range(2 * clients + 2)]
                o = run(model, spec, reqs, clients, eos)
                spec_t = [s for s in steps if s[1]]
                print(
                    f"{clients} clients {kind} rep{rep}: {o.total / o.wall_s:.1f} tok/s, {len(steps)} steps "
                    f"({len(spec_t)} speculative), total {sum(s[0] for s in steps):.2f}s",
                    flush=True,
                )
                for s in sorted(steps, key=lambda s: -s[0])[:6]:
                    print(f"    {s[0] * 1000:8.1f} ms  spec={s[1]}  draft(B, lag, width)={s[2]}")


if __name__ == "__main__":
    main()
