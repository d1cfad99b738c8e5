"""Tool calling as ``vllm serve`` 0.32 does it for a text model (its
``renderers/online_renderer.py``, ``tool_parsers/utils.py``, ``parser/abstract_parser.py`` and
``chat_completion/serving.py``).

- Without ``--enable-auto-tool-choice --tool-call-parser NAME`` (both: vLLM builds a tool
  parser only with both), only ``tool_choice: "none"`` is answered; ``auto`` (also the default
  when ``tools`` are given), ``required`` and a named function are 400s with vLLM's messages.
- With them, ``required`` and a named function constrain the answer with the hermes parser's
  structural tag (``<tool_call>{"name": ..., "arguments": ...}</tool_call>``, one or more calls,
  or one call of the named tool; the arguments follow the tool's schema when it is ``strict``),
  ``auto`` lets the model answer freely (constrained once it opens a call, when a tool is strict
  or ``parallel_tool_calls`` is false), and the parser finds the calls in the text under every
  choice (``VLLM_ENFORCE_STRICT_TOOL_CALLING``, on by default in vLLM 0.32).

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
HERMES_END = "</tool_call>"


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


def structural_tag(req: ChatRequest, has_structured_output: bool) -> str | None:
    """The xgrammar structural tag vllm serve 0.32 puts on a request with tools (its
    ``Parser._apply_structural_tag`` with the hermes parser, ``VLLM_ENFORCE_STRICT_TOOL_CALLING``
    on, as by default, and ``--tool-strict-level auto``), as the JSON text vLLM hands to
    ``StructuredOutputsParams(structural_tag=...)``; None where vLLM puts none.

    A call is ``<tool_call>{"name": "NAME", "arguments": ARGS}</tool_call>`` (with or without
    newlines inside the tags); ARGS follow the tool's ``parameters`` only when the tool is
    ``strict``, else any JSON. ``required`` asks for one or more calls, a named choice for one
    call of that tool, ``auto`` constrains a call once the model opens one (and only when a tool
    is strict or ``parallel_tool_calls`` is false). Kept equal to vLLM's by a unit test."""
    if not req.tools:
        return None
    choice = req.tool_choice
    name = named(req)
    if choice not in ("auto", "required") and name is None:
        return None
    is_auto = choice == "auto"
    single = req.parallel_tool_calls is False
    # vLLM raises the floor to FUNCTION for one call, except auto with a structured output
    function_floor = single and not (is_auto and has_structured_output)
    tools = [t for t in req.tools if name is None or t.function.name == name]
    if is_auto and not function_floor and not any(t.function.strict is True for t in tools):
        return None
    if is_auto and has_structured_output:
        # vLLM ORs the tool tag with the structured output's format; MinT does not build that
        # union: the structured output applies alone (README: "tools").
        return None
    tags = [
        {
            "type": "tag",
            "begin": f'{begin}{{"name": "{t.function.name}", "arguments": ',
            "content": {
                "type": "json_schema",
                "json_schema": _arguments_schema(t),
                "style": "json",
                "any_order": False,
                "max_whitespace_cnt": None,
                "excludes": [],
            },
            "end": end,
        }
        for t in tools
        for begin, end in (
            (f"{HERMES_START}\n", "}\n</tool_call>"),
            (HERMES_START, "}</tool_call>"),
        )
    ]
    fmt: dict[str, Any]
    if is_auto:
        fmt = {
            "type": "triggered_tags",
            "triggers": [HERMES_START],
            "tags": tags,
            "at_least_one": False,
            "stop_after_first": single,
            "excludes": [],
        }
    else:
        fmt = {
            "type": "tags_with_separator",
            "tags": tags,
            "separator": "",
            "at_least_one": True,
            "stop_after_first": name is not None or single,
        }
    return json.dumps({"type": "structural_tag", "format": fmt})


def _arguments_schema(tool: Tool) -> dict[str, Any] | bool:
    """A strict tool's ``parameters`` (any JSON when it has none); any JSON otherwise."""
    if tool.function.strict is not True:
        return True
    return tool.function.parameters if tool.function.parameters is not None else True


@dataclass(frozen=True)
class ToolAnswer:
    """A choice's text read as vLLM reads it under the request's tool choice."""

    content: str | None
    tool_calls: list[dict[str, Any]]


def read_answer(
    req: ChatRequest, text: str, options: ToolOptions, streamed: bool = False
) -> ToolAnswer:
    """The message of a choice: plain content, or tool calls. vLLM's hermes parser reads every
    tool choice (named and required as auto, the parser having a structural tag); a named or
    required choice's content is text, never null (vLLM's ``content or ""``). ``streamed``: as
    vLLM's streaming parser assembles it (a call counts once its name is out)."""
    if options.parser is None or not req.tools or req.tool_choice in (None, "none"):
        return ToolAnswer(text, [])
    if streamed:
        return ToolAnswer(*hermes_streamed(text))
    content, calls = hermes(text)
    if content is not None and not content.strip() and (calls or req.tool_choice != "auto"):
        content = None
    if req.tool_choice != "auto":
        content = content or ""
    return ToolAnswer(content, _first_if_single(req, calls))


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


def hermes_streamed(text: str) -> tuple[str | None, list[dict[str, Any]]]:
    """(content, calls) as vLLM's hermes parser streams them (``extract_tool_calls_streaming``):
    content is the text before the first ``<tool_call>`` (a suffix that may open one held
    back); every ``<tool_call>`` region whose ``"name"`` is out is a call, its arguments the raw
    text after ``"arguments":`` (the closing ``}`` of a complete call dropped), even when
    max_tokens cut the call short."""
    start = text.find(HERMES_START)
    cut = start if start != -1 else len(text) - _overlap(text, HERMES_START)
    calls = []
    pos = start
    while pos != -1:
        body_at = pos + len(HERMES_START)
        end = text.find(HERMES_END, body_at)
        raw = text[body_at:end] if end != -1 else text[body_at:]
        if end == -1:
            raw = raw[: len(raw) - _overlap(raw, HERMES_END)]
        body = raw.strip()
        complete = end != -1 or _is_json(body)
        name = re.search(r'"name"\s*:\s*"([^"]+)"', body)
        if name is None:
            break
        args = re.search(r'"arguments"\s*:\s*', body)
        arguments = body[args.end() :] if args else ""
        if complete and args:
            arguments = arguments.rstrip()
            arguments = arguments[:-1].rstrip() if arguments.endswith("}") else arguments
        calls.append(call(name.group(1), arguments))
        pos = text.find(HERMES_START, end + len(HERMES_END)) if end != -1 else -1
    return (text[:cut] or None), calls


def _overlap(text: str, tag: str) -> int:
    """The longest prefix of ``tag`` that ``text`` ends with (vLLM's partial_tag_overlap)."""
    return next(
        (k for k in range(min(len(tag) - 1, len(text)), 0, -1) if text.endswith(tag[:k])), 0
    )


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


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
