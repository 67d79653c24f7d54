"""A sequence's token ids as the deltas its client sees.

UTF-8-safe detokenizing, stop strings, then reasoning and tool-call markup split out of the text.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from mlx_serve.engine.text.reasoning import ReasoningSplitter
from mlx_serve.engine.text.stops import StopMatcher
from mlx_serve.engine.tools.splitter import ToolCallSplitter
from mlx_serve.engine.types import Delta, TextDelta, TokenLogprob

if TYPE_CHECKING:
    from mlx_serve.engine.model.mlx_boundary import Detokenizer


@dataclass(slots=True)
class RowText:
    """Token ids to client deltas for one sequence: UTF-8-safe detokenizing, stop strings,
    then tool-call markup split out of the text when the request offered tools."""

    detokenizer: Detokenizer
    stops: StopMatcher
    tools: ToolCallSplitter | None = None
    reasoning: ReasoningSplitter | None = None
    pending: list[TokenLogprob] = field(default_factory=list)

    def add(self, token: int, logprob: TokenLogprob | None = None) -> list[Delta]:
        self.detokenizer.add_token(token)
        if logprob is not None:
            self.pending.append(logprob)
        return self._with_logprobs(self._split(self.stops.feed(self.detokenizer.last_segment), (token,)))

    def _with_logprobs(self, out: list[Delta]) -> list[Delta]:
        # A token's log-probability rides on the next text to go out (text may be held back).
        if not self.pending or not any(isinstance(d, TextDelta) for d in out):
            return out
        i = next(i for i, d in enumerate(out) if isinstance(d, TextDelta))
        first = out[i]
        assert isinstance(first, TextDelta)
        out[i] = TextDelta(first.text, first.token_ids, tuple(self.pending))
        self.pending = []
        return out

    def close(self) -> list[Delta]:
        self.detokenizer.finalize()
        out = self._split(self.stops.feed(self.detokenizer.last_segment) + self.stops.flush())
        if self.reasoning is not None:
            out += self._answer(self.reasoning.close())
        out += self.tools.close() if self.tools is not None else []
        if self.pending and not any(isinstance(d, TextDelta) for d in out):
            out.append(TextDelta(""))  # the last tokens' log-probabilities need a carrier
        return self._with_logprobs(out)

    def _split(self, text: str, token_ids: tuple[int, ...] = ()) -> list[Delta]:
        if self.reasoning is not None:
            return self._answer(self.reasoning.feed(text))
        if self.tools is not None:
            return self.tools.feed(text)
        return [TextDelta(text, token_ids)] if text else []

    def _answer(self, parts: list[Delta]) -> list[Delta]:
        # Tool calls live in the answer, not in the reasoning.
        if self.tools is None:
            return parts
        return [d for p in parts for d in (self.tools.feed(p.text) if isinstance(p, TextDelta) else [p])]

    @property
    def called_tools(self) -> bool:
        return self.tools is not None and self.tools.calls > 0

    @property
    def calls_ended(self) -> bool:
        """The tool calls are over and nothing may follow them (engine.tools.splitter)."""
        return self.tools is not None and self.tools.ended
