from __future__ import annotations

from mlx_serve.engine.text.reasoning import ReasoningSplitter, reasoning_splitter
from mlx_serve.engine.types import Delta, ReasoningDelta, TextDelta

OUTPUT = "<think>\nThe user wants a city.\n</think>\n\nParis."


def run(pieces: list[str], inside: bool = False) -> tuple[str, str]:
    s = ReasoningSplitter("<think>", "</think>", inside=inside)
    events: list[Delta] = [e for p in pieces for e in s.feed(p)] + s.close()
    return (
        "".join(e.text for e in events if isinstance(e, ReasoningDelta)),
        "".join(e.text for e in events if isinstance(e, TextDelta)),
    )


def test_reasoning_split_at_every_boundary() -> None:
    want = ("\nThe user wants a city.\n", "\n\nParis.")
    for i in range(len(OUTPUT) + 1):
        for j in range(i, len(OUTPUT) + 1, 5):
            assert run([OUTPUT[:i], OUTPUT[i:j], OUTPUT[j:]]) == want, (i, j)


def test_reasoning_primed_open_think_in_the_prompt() -> None:
    assert run(["plan it</thi", "nk>Answer"], inside=True) == ("plan it", "Answer")


def test_reasoning_splitter_only_for_thinking_tokenizers() -> None:
    class Thinking:
        think_start, think_end = "<think>", "</think>"
        think_start_tokens, think_end_tokens = (7,), (8,)

    assert reasoning_splitter(object(), (1, 2)) is None
    primed = reasoning_splitter(Thinking(), (1, 7, 3))
    closed = reasoning_splitter(Thinking(), (1, 7, 3, 8, 4))
    assert primed is not None and primed.inside
    assert closed is not None and not closed.inside
