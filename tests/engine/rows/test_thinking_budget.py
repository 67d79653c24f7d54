"""The thinking budget as a logits processor, driven as mlx-lm's generation batch drives it."""

from __future__ import annotations

import mlx.core as mx
import pytest

from mlx_serve.engine.rows.thinking_budget import ThinkingBudget

VOCAB = 5000
START, END = 4998, 4999
PROMPT = [1, 2, 3, START]  # a template that leaves <think> open


def run(processor: ThinkingBudget | None, steps: int, script: dict[int, int] | None = None) -> list[int]:
    """Greedy decoding over logits that depend on the step only (a scripted step's argmax is
    the scripted token); the context grows by each token, as the batch's token buffer does."""
    tokens = list(PROMPT)
    out = []
    for step in range(steps):
        logits = mx.random.normal((1, VOCAB), key=mx.random.key(step))
        if script and step in script:
            logits = logits + 100 * (mx.arange(VOCAB) == script[step])
        if processor is not None:
            logits = processor(mx.array(tokens), logits)
        token = int(mx.argmax(logits, axis=-1).item())
        tokens.append(token)
        out.append(token)
    return out


def budget(n: int, message: tuple[int, ...] = (), inside: bool = True) -> ThinkingBudget:
    return ThinkingBudget(n, (*message, END), (START,), (END,), inside=inside)


@pytest.mark.parametrize("n", [0, 1, 5])
def test_the_thinking_closes_at_exactly_the_budget_and_decoding_carries_on(n: int) -> None:
    free = run(None, 12)
    assert END not in free
    bounded = run(budget(n), 12)
    assert bounded[:n] == free[:n]  # untouched until the budget is spent
    assert bounded[n] == END
    assert bounded[n + 1 :] == free[n + 1 :]  # then the row samples as it did


def test_the_budget_message_comes_before_the_end_of_thinking() -> None:
    assert run(budget(3, (30, 31)), 8)[3:6] == [30, 31, END]


def test_a_row_that_closes_its_thinking_itself_is_left_alone() -> None:
    script = {2: END}
    assert run(budget(5), 12, script) == run(None, 12, script)


def test_thinking_the_row_opens_itself_counts_from_its_opening() -> None:
    script = {1: START}
    free = run(None, 10, script)
    bounded = run(budget(3, inside=False), 10, script)
    assert bounded[:5] == free[:5] and bounded[5] == END


def test_a_row_that_never_opens_its_thinking_is_never_touched() -> None:
    assert run(budget(0, inside=False), 30) == run(None, 30)
