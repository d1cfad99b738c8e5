"""Tool calling as ``vllm serve`` 0.32 does it for a text model (its
``renderers/online_renderer.py``, ``tool_parsers/utils.py``, ``parser/abstract_parser.py`` and
``chat_completion/serving.py``).

- Without ``--enable-auto-tool-choice --tool-call-parser NAME`` (both: vLLM builds a tool
  parser only with both), only ``tool_choice: "none"`` is answered; ``auto`` (also the default
  when ``tools`` are given), ``required`` and a named function are 400s with vLLM's messages.
- With them, a named function constrains the answer to the function's ``parameters`` schema (a
  structured output) and answers it as one tool call whose ``arguments`` is the text;
  ``required`` constrains it to a JSON array of ``{"name", "parameters"}`` (one ``anyOf`` per
  tool, ``maxItems: 1`` when ``parallel_tool_calls`` is false) and answers each item as a call
  (``finish_reason`` ``tool_calls``); ``auto`` lets the model answer freely and the parser finds
  the calls in the text (``hermes``: ``<tool_call>{"name", "arguments"}</tool_call>``).

MinT implements the ``hermes`` parser; vLLM's other parsers are model-specific formats.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

from gateway.bodies import ChatRequest, NamedToolChoice, Tool
from gateway.errors import BadRequest

PARSERS = ("hermes",)
HERMES_CALL = re.compile(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)", re.DOTALL)
HERMES_START = "<tool_call>"


@dataclass(frozen=True)
class ToolOptions:
    """``vllm serve``'s ``--enable-auto-tool-choice`` and ``--tool-call-parser``."""

    tool_call_parser: str | None = None
    enable_auto_tool_choice: bool = False

    def __post_init__(self) -> None:
        if self.enable_auto_tool_choice and not self.tool_call_parser:
            raise ValueError("--enable-auto-tool-choice requires --tool-call-parser")
        if self.tool_call_parser is not None and self.tool_call_parser not in PARSERS:
            raise ValueError(
                f"--tool-call-parser {self.tool_call_parser!r} is not one MinT implements "
                f"(choose from {', '.join(PARSERS)})"
            )

    @property
    def parser(self) -> str | None:
        """The tool parser vLLM would build: only with both options."""
        return self.tool_call_parser if self.enable_auto_tool_choice else None


def make_tool_call_id() -> str:
    return f"chatcmpl-tool-{uuid.uuid4().hex}"


def check_tool_choice(req: ChatRequest, options: ToolOptions) -> None:
    """vLLM's refusal of a tool choice it has no parser for (its exact messages)."""
    choice = req.tool_choice
    if options.parser is not None or choice in (None, "none"):
        return
    if choice == "auto":
        raise BadRequest(
            '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set'
        )
    desc = (
        f'function "{choice.function.name}"'
        if isinstance(choice, NamedToolChoice)
        else f'"{choice}"'
    )
    raise BadRequest(f"tool_choice={desc} requires --tool-call-parser to be set")


def named(req: ChatRequest) -> str | None:
    return req.tool_choice.function.name if isinstance(req.tool_choice, NamedToolChoice) else None


def tool_schema(req: ChatRequest) -> dict[str, Any] | None:
    """The JSON schema a tool choice constrains the answer to (vLLM's
    ``get_json_schema_from_tools``): None for ``none`` and ``auto``."""
    if req.tools is None or req.tool_choice in (None, "none", "auto"):
        return None
    name = named(req)
    if name is not None:
        tool = next(t for t in req.tools if t.function.name == name)
        return _params_or_empty_object(tool.function.parameters)
    schema: dict[str, Any] = {
        "type": "array",
        "minItems": 1,
        "items": {"type": "object", "anyOf": [_tool_item(t) for t in req.tools]},
    }
    if req.parallel_tool_calls is False:
        schema["maxItems"] = 1
    defs = _defs(req.tools)
    if defs:
        schema["$defs"] = defs
    return schema


def _params_or_empty_object(params: dict[str, Any] | None) -> dict[str, Any]:
    return params if params else {"type": "object", "properties": {}}


def _tool_item(tool: Tool) -> dict[str, Any]:
    # vLLM builds the item before it moves $defs to the top (from the same dict)
    given = tool.function.parameters
    params = {k: v for k, v in given.items() if k != "$defs"} if given else None
    return {
        "properties": {
            "name": {"type": "string", "enum": [tool.function.name]},
            "parameters": params if params is not None else _params_or_empty_object(None),
        },
        "required": ["name", "parameters"],
    }


def _defs(tools: list[Tool]) -> dict[str, Any]:
    """Every tool's ``$defs`` hoisted to the top of the schema (vLLM refuses a name defined
    twice differently)."""
    out: dict[str, Any] = {}
    for tool in tools:
        defs = (tool.function.parameters or {}).get("$defs", {})
        if not isinstance(defs, dict):
            raise BadRequest(
                f"`$defs` in the parameters of tool '{tool.function.name}' must be an object, "
                f"got {type(defs).__name__}.",
                param="tools",
            )
        for name, schema in defs.items():
            if name in out and out[name] != schema:
                raise BadRequest(
                    f"Tool definition '{name}' has multiple schemas, which is not supported.",
                    param="tools",
                )
            out[name] = schema
    return out


@dataclass(frozen=True)
class ToolAnswer:
    """A choice's text read as vLLM reads it under the request's tool choice."""

    content: str | None
    tool_calls: list[dict[str, Any]]


def read_answer(req: ChatRequest, text: str, options: ToolOptions) -> ToolAnswer:
    """The message of a choice: plain content, or tool calls (vLLM's parse)."""
    if options.parser is None or not req.tools or req.tool_choice in (None, "none"):
        return ToolAnswer(text, [])
    name = named(req)
    if name is not None:
        if not text.strip():
            return ToolAnswer("", [])
        return ToolAnswer("", [call(name, text)])
    if req.tool_choice == "required":
        calls = []
        try:
            items = json.loads(text or "")
        except ValueError:
            items = None
        if isinstance(items, list) and all(_is_definition(i) for i in items):
            calls = [
                call(i["name"], json.dumps(i.get("parameters"), ensure_ascii=False)) for i in items
            ]
        return ToolAnswer("", _first_if_single(req, calls))
    content, calls = hermes(text)
    return ToolAnswer(content, _first_if_single(req, calls))


def _is_definition(item: object) -> bool:
    return isinstance(item, dict) and isinstance(item.get("name"), str)


def _first_if_single(req: ChatRequest, calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return calls[:1] if req.parallel_tool_calls is False else calls


def call(name: str, arguments: str) -> dict[str, Any]:
    return {
        "id": make_tool_call_id(),
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }


def hermes(text: str) -> tuple[str | None, list[dict[str, Any]]]:
    """(content, calls) of vLLM's hermes parser: the text before the first ``<tool_call>``
    (None when empty) and each call's ``arguments`` as JSON; the whole text as content when a
    call does not parse."""
    if HERMES_START not in text:
        return text, []
    try:
        found = [json.loads(a or b) for a, b in HERMES_CALL.findall(text)]
        calls = [call(f["name"], json.dumps(f["arguments"], ensure_ascii=False)) for f in found]
    except (ValueError, KeyError, TypeError):
        return text, []
    content = text[: text.find(HERMES_START)]
    return (content or None), calls


def tool_dicts(tools: list[Tool] | None) -> list[dict[str, Any]] | None:
    """The tools as vLLM hands them to the chat template (``tool.model_dump()``)."""
    if tools is None:
        return None
    out = []
    for t in tools:
        fn: dict[str, Any] = {
            "name": t.function.name,
            "description": t.function.description,
            "parameters": t.function.parameters,
        }
        if t.function.strict is not None:
            fn["strict"] = t.function.strict
        out.append({"type": "function", "function": fn})
    return out
