"""Responses tools: what a request offers, as the model sees it and as the answer names it.

- `function` tools go to the template as they are.
- `namespace` tools (Codex's `multi_agent_v1`, MCP servers) are flattened: each member is a
  function named `<namespace>__<name>` for the model (`<namespace><name>` when the namespace
  ends in `_`), and a call to it comes back as a `function_call` with the member's `name` and
  the `namespace`, as the API answers.
- `custom` (freeform) tools such as Codex's `apply_patch` are functions taking one string,
  `input`; the grammar or format of that input joins the description. A call comes back as a
  `custom_tool_call` with that input.
- Tools the API's servers run (web and file search, code interpreter, computer use, image
  generation, MCP connectors, client tool search) cannot run here: they are not offered to the
  model, and a `Warning` header names each. A `defer_loading` function waits for tool search,
  so it is not offered either.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec
from msgspec import Struct

from mlx_serve.engine.errors import InvalidRequest
from mlx_serve.protocols import conversation as conv
from mlx_serve.protocols import openai_common as common

HOSTED_TOOLS = frozenset(
    {
        "web_search",
        "web_search_preview",
        "web_search_2025_08_26",
        "web_search_preview_2025_03_11",
        "file_search",
        "code_interpreter",
        "computer",
        "computer_use",
        "computer_use_preview",
        "image_generation",
        "mcp",
        "tool_search",
    }
)


class FunctionTool(Struct, frozen=True, kw_only=True):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    # Accepted; arguments follow the schema when `tool_choice` forces a call (as in chat).
    strict: bool | None = None
    defer_loading: bool = False


class CustomFormat(Struct, frozen=True, kw_only=True):
    type: Literal["text", "grammar"] = "text"
    syntax: str | None = None
    definition: str | None = None


class CustomTool(Struct, frozen=True, kw_only=True):
    name: str
    description: str | None = None
    format: CustomFormat = CustomFormat()
    defer_loading: bool = False


class Namespace(Struct, frozen=True, kw_only=True):
    name: str
    description: str | None = None
    tools: list[dict[str, Any]] = []


@dataclass(frozen=True, slots=True)
class Offered:
    """One tool the model may call: how the API names it and how the model does."""

    kind: Literal["function", "custom"]
    name: str
    namespace: str | None
    model_name: str


@dataclass(slots=True)
class Toolset:
    """The tools of a request: for the template, for the answer's items, for the echo."""

    template: list[dict[str, Any]] = field(default_factory=list)
    offered: dict[str, Offered] = field(default_factory=dict)  # by model name
    echo: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def model_name(self, name: str, namespace: str | None) -> str:
        """The prompt's name for a tool the API names so (calls the client replays)."""
        for tool in self.offered.values():
            if (tool.name, tool.namespace) == (name, namespace):
                return tool.model_name
        return flat_name(namespace, name) if namespace else name

    def called(self, model_name: str) -> Offered:
        """What a call the model made is, for the answer (an unknown name: a plain function)."""
        return self.offered.get(model_name) or Offered("function", model_name, None, model_name)


def flat_name(namespace: str | None, name: str) -> str:
    if not namespace:
        return name
    return f"{namespace}{name}" if namespace.endswith("_") else f"{namespace}__{name}"


def toolset(raw: list[dict[str, Any]] | None) -> Toolset:
    """Every tool of the request, checked; a 400 names the tool it cannot take."""
    tools = Toolset()
    for i, spec in enumerate(raw or ()):
        kind = spec.get("type")
        path = f"tools[{i}]"
        if kind == "function":
            _add_function(tools, _convert(spec, FunctionTool, path), None, spec)
        elif kind == "custom":
            _add_custom(tools, _convert(spec, CustomTool, path), None, spec)
        elif kind == "namespace":
            _add_namespace(tools, _convert(spec, Namespace, path), path, spec)
        elif kind in HOSTED_TOOLS:
            tools.warnings.append(_hosted_note(str(kind)))
        else:
            raise InvalidRequest(
                f"tool type {kind!r} is not supported: only function, custom and namespace tools "
                "(and, left out with a Warning, the tools the API's servers run)",
                param=f"{path}.type",
            )
    return tools


def _hosted_note(kind: str) -> str:
    return conv.warning(
        f"tool {kind!r} runs on the API's servers; this server cannot run it, so the model was not offered it"
    )


def _convert(spec: dict[str, Any], kind: type[Any], path: str) -> Any:
    try:
        return msgspec.convert({k: v for k, v in spec.items() if k != "type"}, kind)
    except msgspec.ValidationError as exc:
        raise common.invalid_at(exc, path) from exc


def _add_function(
    tools: Toolset, fn: FunctionTool, namespace: Namespace | None, spec: dict[str, Any]
) -> None:
    if fn.defer_loading:
        return
    model_name = _unique(tools, flat_name(namespace.name if namespace else None, fn.name))
    tools.offered[model_name] = Offered(
        "function", fn.name, namespace.name if namespace else None, model_name
    )
    tools.template.append(
        conv.function_tool(model_name, _described(namespace, fn.description), fn.parameters)
    )
    if namespace is None:
        tools.echo.append(_echo_function(fn, spec))


def _add_custom(tools: Toolset, tool: CustomTool, namespace: Namespace | None, spec: dict[str, Any]) -> None:
    if tool.defer_loading:
        return
    model_name = _unique(tools, flat_name(namespace.name if namespace else None, tool.name))
    tools.offered[model_name] = Offered(
        "custom", tool.name, namespace.name if namespace else None, model_name
    )
    description = _described(namespace, tool.description)
    tools.template.append(
        conv.function_tool(model_name, _custom_description(description, tool.format), CUSTOM_INPUT)
    )
    if namespace is None:
        tools.echo.append(spec)


def _add_namespace(tools: Toolset, ns: Namespace, path: str, spec: dict[str, Any]) -> None:
    for j, member in enumerate(ns.tools):
        kind, at = member.get("type"), f"{path}.tools[{j}]"
        if kind == "function":
            _add_function(tools, _convert(member, FunctionTool, at), ns, member)
        elif kind == "custom":
            _add_custom(tools, _convert(member, CustomTool, at), ns, member)
        else:
            raise InvalidRequest(
                f"a namespace holds function and custom tools, not {kind!r}", param=f"{at}.type"
            )
    tools.echo.append(spec)


CUSTOM_INPUT: dict[str, Any] = {
    "type": "object",
    "properties": {"input": {"type": "string", "description": "The tool's whole input, as free-form text."}},
    "required": ["input"],
    "additionalProperties": False,
}


def _custom_description(description: str | None, fmt: CustomFormat) -> str:
    text = description or ""
    if fmt.type == "grammar" and fmt.definition:
        rule = f"The input must follow this {fmt.syntax or 'lark'} grammar:\n{fmt.definition}"
        text = f"{text}\n\n{rule}" if text else rule
    return text


def _described(namespace: Namespace | None, description: str | None) -> str | None:
    # A flattened member has no field of its own for the namespace's description: it leads.
    if namespace is None or not namespace.description:
        return description
    return f"{namespace.description}\n\n{description}" if description else namespace.description


def _unique(tools: Toolset, name: str) -> str:
    candidate, n = name, 2
    while candidate in tools.offered:
        candidate, n = f"{name}_{n}", n + 1
    return candidate


def _echo_function(fn: FunctionTool, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        **spec,
        "type": "function",
        "name": fn.name,
        "description": fn.description,
        "parameters": fn.parameters,
        "strict": fn.strict,
    }


def custom_input(arguments: str) -> str:
    """A custom tool call's input from the JSON arguments the model wrote: `input`'s text, or
    the arguments themselves when the model wrote something else."""
    try:
        value = msgspec.json.decode(arguments or "{}")
    except msgspec.DecodeError:
        return arguments
    if isinstance(value, dict) and isinstance(value.get("input"), str) and len(value) == 1:
        return str(value["input"])
    return arguments
