"""Chat templates and prompt tokenizing as a bounded part of one request.

- `chat_template_kwargs` reach the template as template variables only: a key the template
  does not read is dropped, and `apply_chat_template`'s own options (`return_tensors`,
  `tokenize`, `truncation`, `max_length`, `padding`, `chat_template`, …) never pass, whatever
  the template reads (they would reshape or replace the prompt, or return something else).
- Rendering has a deadline (RENDER_TIMEOUT_S) and a size cap (RENDER_MAX_CHARS); whatever the
  template raises ({{ 1/0 }}, a sandbox refusal such as range(10**9), a recursive macro) is a
  ValueError carrying its message, which the protocols answer with a 400.
- Tokenizing stops early for a prompt that cannot fit: growing prefixes are tokenized, and one
  that is already past the context is refused without reading the rest (a 30 MB prompt costs
  what its first few hundred KB cost).
- Rendering stops early too (`too_long_verbatim`): a string so long that any `bound` characters
  of it are more tokens than the context holds is rendered shortened (its first `bound` + 2
  margins characters and its last margin); when the template wrote the `bound` characters after
  the first margin verbatim, the prompt cannot fit and is refused without rendering (or copying)
  the whole. Otherwise (the template cut or changed the string) the full render decides. This keeps a 30 MB message from holding the GIL (and so the event loop) for tens of
  milliseconds in the template's string copies.
"""

from __future__ import annotations

import ctypes
import functools
import heapq
import itertools
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import jinja2
from jinja2 import meta

from mlx_serve.engine.errors import ContextTooLong

RENDER_TIMEOUT_S = 10.0
RENDER_MAX_CHARS = 64 << 20
PROBE_CHARS_PER_TOKEN = 8  # the first probe of a long prompt: this many characters per context token
# transformers' apply_chat_template parameters, and the names it passes to the template itself.
APPLY_OPTIONS = frozenset(
    {
        "conversation",
        "messages",
        "tools",
        "documents",
        "chat_template",
        "add_generation_prompt",
        "continue_final_message",
        "tokenize",
        "sanitize_control_tokens",
        "padding",
        "truncation",
        "max_length",
        "return_tensors",
        "return_dict",
        "return_assistant_tokens_mask",
        "tokenizer_kwargs",
    }
)
# What a template raises on its own: jinja's errors (sandbox refusals are SecurityError, a
# TemplateError) and the Python errors of the expressions it evaluates.
TEMPLATE_FAULTS = (
    jinja2.TemplateError,
    ArithmeticError,
    AttributeError,
    IndexError,
    KeyError,
    RecursionError,
    TypeError,
    ValueError,
)


class TemplateTimeout(Exception):
    """Raised inside a render that ran past its deadline."""


def template_kwargs(kwargs: dict[str, Any], variables: frozenset[str] | None) -> dict[str, Any]:
    """The kwargs that are template variables (all but the options when they cannot be told)."""
    return {
        k: v for k, v in kwargs.items() if k not in APPLY_OPTIONS and (variables is None or k in variables)
    }


def template_variables(wrapper: Any) -> frozenset[str] | None:
    """The names the model's Jinja chat template reads; None when it cannot be told (mlx-lm's
    Python renderers, a template with extensions a plain parse does not know)."""
    if getattr(wrapper, "_chat_template", None) is not None:  # mlx-lm renders this model in Python
        return None
    source = getattr(wrapper, "chat_template", None)
    if isinstance(source, dict):
        found = [source_variables(s) for s in source.values() if isinstance(s, str)]
        return None if any(f is None for f in found) else frozenset().union(*[f for f in found if f])
    return source_variables(source) if isinstance(source, str) else None


@functools.lru_cache(maxsize=8)
def source_variables(source: str) -> frozenset[str] | None:
    """The undeclared names one template source reads; None when it does not parse. Cached: the
    server asks it per request, and the load's warm-up and `template_uses_tools` share it."""
    try:
        ast = jinja2.Environment(extensions=["jinja2.ext.loopcontrols"]).parse(source)
    except jinja2.TemplateSyntaxError:
        return None
    return frozenset(meta.find_undeclared_variables(ast))


@dataclass(frozen=True, slots=True)
class RenderLimits:
    timeout_s: float = RENDER_TIMEOUT_S
    max_chars: int = RENDER_MAX_CHARS


def render(
    wrapper: Any,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    kwargs: dict[str, Any],
    limits: RenderLimits = RenderLimits(),
) -> str:
    """The chat template's text for this conversation (with a generation prompt)."""
    kwargs = template_kwargs(kwargs, template_variables(wrapper))
    try:
        with deadline(limits.timeout_s):
            text = wrapper.apply_chat_template(
                messages, tools=tools, add_generation_prompt=True, tokenize=False, **kwargs
            )
    except TemplateTimeout:
        raise ValueError(f"chat template failed: rendering took longer than {limits.timeout_s:g} s") from None
    except TEMPLATE_FAULTS as exc:
        raise ValueError(f"chat template failed: {type(exc).__name__}: {exc}") from exc
    if not isinstance(text, str):
        raise ValueError(f"chat template failed: it rendered a {type(text).__name__}, not text")  # noqa: TRY004 - protocols answer ValueError with a 400
    if len(text) > limits.max_chars:
        raise ValueError(f"chat template failed: it rendered over {limits.max_chars:,} characters")
    return text


VERBATIM_MARGIN = 1024  # characters a template may strip or change at either end of a string


def too_long_verbatim(
    wrapper: Any,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    kwargs: dict[str, Any],
    bound: int,
) -> int | None:
    """The length of a string the template writes verbatim when `bound` characters of it cannot
    fit the context (so neither can the prompt); None when there is none, or it cannot be told.

    Each string over `bound` + 4 margins is rendered as its first `bound` + 2 margins characters
    and its last margin; the piece checked for is the `bound` characters after the first margin,
    so a template that trims or edits either end still shows it."""
    pieces: list[str] = []
    longest = 0
    m = VERBATIM_MARGIN

    def shorten(value: Any) -> Any:
        nonlocal longest
        if isinstance(value, str) and len(value) > bound + 4 * m:
            pieces.append(value[m : m + bound])
            longest = max(longest, len(value))
            return value[: bound + 2 * m] + value[-m:]
        if isinstance(value, dict):
            return {k: shorten(v) for k, v in value.items()}
        if isinstance(value, list):
            return [shorten(v) for v in value]
        return value

    short_messages, short_tools = shorten(messages), shorten(tools)
    if not pieces:
        return None
    text = render(wrapper, short_messages, short_tools, kwargs)
    return longest if any(piece in text for piece in pieces) else None


def encode_within(wrapper: Any, text: str, max_tokens: int | None, **options: Any) -> list[int]:
    """Token ids of `text`, or ContextTooLong as soon as a prefix of it is past `max_tokens`."""
    if max_tokens is not None:
        size = max(max_tokens, 1) * PROBE_CHARS_PER_TOKEN
        while size < len(text):
            head = len(wrapper.encode(text[:size], **options))
            if head > max_tokens + 1:  # +1: the cut may split what is one token in the whole
                raise ContextTooLong(
                    f"This model's maximum context length is {max_tokens} tokens, but the prompt's "
                    f"first {size:,} characters alone are {head:,} tokens. Please shorten the prompt."
                )
            size *= PROBE_CHARS_PER_TOKEN
    return list(wrapper.encode(text, **options))


@contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Raise TemplateTimeout in this thread should the block run past `seconds` (at the next
    Python instruction: a pure-Python loop in a template is stopped; one C call is not).

    One watchdog thread serves every deadline: a thread started per render (threading.Timer)
    cost each request 0.1-0.7 ms on an idle 2-core box and ~1.6 ms in a 64-client burst there,
    most of its template's whole render, waiting for the new thread to be scheduled."""
    watch = _Watch(threading.get_ident())
    _WATCHDOG.arm(watch, time.monotonic() + seconds)
    try:
        yield
    finally:
        watch.disarm()


class _Watch:
    def __init__(self, thread_id: int) -> None:
        self._thread_id = ctypes.c_ulong(thread_id)
        self._lock = threading.Lock()
        self.armed = True
        self._fired = False

    def fire(self) -> None:
        with self._lock:
            if self.armed:
                ctypes.pythonapi.PyThreadState_SetAsyncExc(self._thread_id, ctypes.py_object(TemplateTimeout))
                self._fired = True

    def disarm(self) -> None:
        with self._lock:
            self.armed = False
            if self._fired:  # not raised yet (the block ended first): clear it
                ctypes.pythonapi.PyThreadState_SetAsyncExc(self._thread_id, None)


class _Watchdog:
    """A daemon thread that fires each armed watch whose time has come, earliest first. Ended
    blocks leave their disarmed watches in the heap; they are dropped as their time comes (one
    wake-up gathers every watch due by then and the next SLACK_S)."""

    SLACK_S = 0.05

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._due: list[tuple[float, int, _Watch]] = []
        self._order = itertools.count()
        self._thread: threading.Thread | None = None

    def arm(self, watch: _Watch, due: float) -> None:
        with self._cond:
            if self._thread is None or not self._thread.is_alive():  # first use, or a forked child
                self._thread = threading.Thread(target=self._run, name="template-deadlines", daemon=True)
                self._thread.start()
            heapq.heappush(self._due, (due, next(self._order), watch))
            if self._due[0][2] is watch:  # sooner than what the thread sleeps for
                self._cond.notify()

    def _run(self) -> None:
        with self._cond:
            while True:
                now = time.monotonic()
                while self._due and self._due[0][0] <= now + self.SLACK_S:
                    due, _, watch = self._due[0]
                    if due > now and watch.armed:
                        break  # an armed watch within the slack: its own time
                    heapq.heappop(self._due)
                    if watch.armed:
                        watch.fire()
                self._cond.wait(self._due[0][0] - now if self._due else None)


_WATCHDOG = _Watchdog()
