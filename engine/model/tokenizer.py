"""The tokenizer as the protocols see it: text and chat messages in, token ids out."""

from __future__ import annotations

import functools
import json
import logging
from typing import Any

from mlx_serve.engine.errors import ContextTooLong
from mlx_serve.engine.model import templating

log = logging.getLogger("mlx_serve")

# How a model whose chat template knows no tools learns of them: a system section in the hermes
# markup the engine parses when the template names no other (engine.tools.formats.HERMES).
TOOLS_HEADER = (
    "# Tools\n\n"
    "You may call functions to help with the user's request. Their signatures, as JSON, are "
    "inside <tools></tools>:\n<tools>\n"
)
TOOLS_FOOTER = (
    "\n</tools>\n\n"
    "To call a function, write a JSON object with its name and arguments inside "
    "<tool_call></tool_call> tags, one call per pair of tags:\n"
    '<tool_call>\n{"name": <function-name>, "arguments": <arguments-json-object>}\n</tool_call>\n'
    "The results come back inside <tool_response></tool_response> tags."
)


SYSTEM_PROBE = "mlx-serve-system-turn-probe"


class ChatTokenizer:
    """Wraps mlx-lm's TokenizerWrapper. Pure CPU work, bounded (engine.model.templating): call it off
    the event loop. A prompt past `max_prompt_tokens` is refused with ContextTooLong."""

    def __init__(self, wrapper: Any, max_prompt_tokens: int | None = None, span: int | None = None) -> None:
        self._wrapper = wrapper
        self.max_prompt_tokens = max_prompt_tokens
        self._span = span  # spelling_span(wrapper), when the loader has it already

    @property
    def wrapper(self) -> Any:
        return self._wrapper

    @property
    def eos_token_ids(self) -> frozenset[int]:
        return frozenset(self._wrapper.eos_token_ids)

    @property
    def vocab_size(self) -> int:
        return len(self._wrapper)

    @property
    def has_chat_template(self) -> bool:
        return bool(self._wrapper.has_chat_template)

    @property
    def thinks(self) -> bool:
        """Whether the model writes its reasoning between thinking markers (as mlx-lm infers
        them from the vocabulary): what a thinking budget bounds."""
        return bool(getattr(self._wrapper, "think_end_tokens", None))

    @functools.cached_property
    def reads_effort(self) -> bool:
        """Whether the chat template reads a reasoning switch (`enable_thinking`, Qwen3's, or a
        `reasoning_effort` level) that a request's effort sets."""
        template = getattr(self._wrapper, "chat_template", None)
        return isinstance(template, str) and ("enable_thinking" in template or "reasoning_effort" in template)

    @functools.cached_property
    def supports_tools(self) -> bool:
        """Whether the chat template renders `tools` itself; without, `render_chat` describes
        them in a system message and writes past calls and results as hermes markup."""
        if getattr(self._wrapper, "_chat_template", None) is not None:
            return True  # a custom renderer: it takes `tools`, we cannot look inside
        if not self.has_chat_template:
            return False
        return template_uses_tools(getattr(self._wrapper, "chat_template", None))

    @functools.cached_property
    def system_turns(self) -> bool:
        """Whether the chat template renders a system turn after the conversation has begun
        (probed once); without, `render_chat` folds such turns into the user's text."""
        if not self.has_chat_template:
            return True  # the plain transcript writes every role
        probe = [
            {"role": "system", "content": "s"},
            {"role": "user", "content": "u"},
            {"role": "assistant", "content": "a"},
            {"role": "system", "content": SYSTEM_PROBE},
            {"role": "user", "content": "v"},
        ]
        try:
            return SYSTEM_PROBE in templating.render(self._wrapper, probe, None, {})
        except ValueError:
            return False

    def encode(self, text: str) -> list[int]:
        """Raw text prompt: BOS added when the tokenizer's config says so."""
        return templating.encode_within(self._wrapper, text, self.max_prompt_tokens)

    def encode_continuation(self, text: str) -> list[int]:
        """Text that continues a sequence (a predicted output): no BOS or other special tokens."""
        return list(self._wrapper.encode(text, add_special_tokens=False))

    def decode(self, ids: list[int]) -> str:
        return str(self._wrapper.decode(ids))

    def render_chat(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        template_kwargs: dict[str, Any] | None = None,
    ) -> list[int]:
        """Apply the chat template (with a generation prompt) and tokenize.

        A template without tool support still gets the tools (see `supports_tools`).
        Raises ValueError with the template's own message when it rejects the conversation
        (or runs past its bounds); only template variables of `template_kwargs` reach it.
        """
        kwargs = dict(template_kwargs or {})  # the protocols merge the server's defaults in
        if _late_system(messages) and not self.system_turns:
            messages = with_system_turns_as_user(messages)
        if not self.supports_tools:
            messages, tools = with_tools_described(messages, tools), None
        if not self.has_chat_template:
            return self.encode(_plain_transcript(messages))
        bound = self.verbatim_bound
        if bound is not None and (
            size := templating.too_long_verbatim(self._wrapper, messages, tools, kwargs, bound)
        ):
            raise ContextTooLong(
                f"This model's maximum context length is {self.max_prompt_tokens} tokens, but the prompt holds "
                f"a {size:,}-character string: any {bound:,} characters of it are more tokens than that. "
                "Please shorten the prompt."
            )
        text = templating.render(self._wrapper, messages, tools, kwargs)
        return templating.encode_within(self._wrapper, text, self.max_prompt_tokens, add_special_tokens=False)

    @functools.cached_property
    def verbatim_bound(self) -> int | None:
        """A number of characters that is always more than `max_prompt_tokens` tokens, whatever the
        text (see `spelling_span`)."""
        if self.max_prompt_tokens is None:
            return None
        if self._span is None:
            self._span = spelling_span(self._wrapper)
        return (self.max_prompt_tokens + 1) * self._span if self._span else None

    def detokenizer(self) -> Any:
        """A fresh streaming detokenizer (UTF-8 safe: holds back partial characters)."""
        return self._wrapper.detokenizer


def warm_prompt_path(wrapper: Any) -> None:
    """Render and tokenize one short conversation where the tokenizer was loaded (off the event
    loop, before ready), so the chat template's compile, its variables and the tokenizer's first
    encode are paid once there, not by each of a fresh server's first concurrent requests (on the
    H200 a fresh server's first 16-client burst waited 100-109 ms p95 from arrival to the engine
    for them, against 10 ms warmed; issue 19 item 3)."""
    try:
        ChatTokenizer(wrapper).render_chat([{"role": "user", "content": "hello"}])
    except Exception:  # a template that refuses this conversation serves the others as before
        log.debug("warming the chat template failed", exc_info=True)


def spelling_span(wrapper: Any) -> int:
    """The most characters of text one token can stand for (0: cannot be told): its longest
    spelling in the vocabulary, times how many characters of text one character of a spelling
    can stand for (1 with no normalizer; 2 under NFC/NFD, which compose up to four characters
    into one of three UTF-8 bytes; 4 under any other). Reading the vocabulary holds the GIL for
    tens of milliseconds with a large one: do it as the model loads, off the event loop."""
    vocab = wrapper.get_vocab() if hasattr(wrapper, "get_vocab") else None
    if not vocab:
        return 0
    backend = getattr(getattr(wrapper, "_tokenizer", wrapper), "backend_tokenizer", None)
    normalizer = getattr(backend, "normalizer", None)
    factor = 1 if normalizer is None else 2 if str(normalizer) in ("NFC()", "NFD()") else 4
    return factor * max(len(k) for k in vocab)


def template_uses_tools(template: Any) -> bool:
    """Whether a Jinja chat template (or any of a named set of them) reads `tools`."""
    if isinstance(template, dict):
        return any(template_uses_tools(t) for t in template.values())
    if not isinstance(template, str):
        return False
    variables = templating.source_variables(template)
    return "tools" in (template if variables is None else variables)


def with_tools_described(
    messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
) -> list[dict[str, Any]]:
    """The conversation for a template that knows no tools: the tools as a system section,
    past calls as <tool_call> markup in the assistant's text, results as <tool_response>
    blocks in a user turn (consecutive results in one)."""
    out: list[dict[str, Any]] = []
    for message in messages:
        role = message.get("role")
        if role == "tool":
            block = f"<tool_response>\n{message.get('content') or ''}\n</tool_response>"
            if out and out[-1].get("tool_results"):
                out[-1]["content"] += "\n" + block
            else:
                out.append({"role": "user", "content": block, "tool_results": True})
        elif role == "assistant" and message.get("tool_calls"):
            out.append(_calls_as_text(message))
        else:
            out.append(dict(message))
    for message in out:
        message.pop("tool_results", None)
    if tools:
        section = TOOLS_HEADER + "\n".join(json.dumps(t, ensure_ascii=False) for t in tools) + TOOLS_FOOTER
        if out and out[0].get("role") == "system":
            head = out[0].get("content") or ""
            out[0] = {**out[0], "content": f"{head}\n\n{section}" if head else section}
        else:
            out.insert(0, {"role": "system", "content": section})
    return out


def _late_system(messages: list[dict[str, Any]]) -> bool:
    roles = [m.get("role") for m in messages]
    return "system" in roles[next((i for i, r in enumerate(roles) if r != "system"), len(roles)) :]


def with_system_turns_as_user(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The conversation for a template that takes a system message only first: a later system
    turn joins the user's text where it stands (the turns before it keep their tokens), ahead
    of the next user turn when an assistant turn came before it."""
    out: list[dict[str, Any]] = []
    begun, folded = False, False
    for message in messages:
        role, content = message.get("role"), message.get("content") or ""
        last = out[-1] if out else {}
        if (role == "system" and begun) or (role == "user" and folded):
            if (
                last.get("role") == "user"
                and isinstance(last.get("content"), str)
                and isinstance(content, str)
            ):
                out[-1] = {**last, "content": "\n\n".join(t for t in (last["content"], content) if t)}
            else:
                out.append({**message, "role": "user"})
            folded = role == "system"
            continue
        begun, folded = begun or role != "system", False
        out.append(dict(message))
    return out


def _calls_as_text(message: dict[str, Any]) -> dict[str, Any]:
    parts = [message.get("content") or ""]
    for call in message["tool_calls"]:
        function = call.get("function", call)
        body = {"name": function.get("name"), "arguments": function.get("arguments", {})}
        parts.append(f"<tool_call>\n{json.dumps(body, ensure_ascii=False)}\n</tool_call>")
    out = {k: v for k, v in message.items() if k != "tool_calls"}
    out["content"] = "\n".join(p for p in parts if p)
    return out


def _plain_transcript(messages: list[dict[str, Any]]) -> str:
    # A model without a chat template still gets every turn, in order.
    lines = [f"{m.get('role', 'user')}: {m.get('content') or ''}" for m in messages]
    return "\n".join(lines) + "\nassistant:"
