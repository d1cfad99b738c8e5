"""A request's settings as ``infer.requested`` carries them (gateway.sampling): vllm serve's
defaults and conversions, structured outputs from ``response_format`` / ``structured_outputs``
/ a tool choice, and the contract's bounds refused with vLLM's messages."""

from __future__ import annotations

import json
import re

import pytest

from gateway.api import validate
from gateway.asks import build
from gateway.bodies import ChatRequest, CompletionRequest
from gateway.config import GatewayConfig
from gateway.errors import BadRequest
from gateway.sampling import event_fields, max_tokens_of, options
from gateway.tools import ToolOptions
from schemas.events.sampling import SamplingOptions, StructuredOutput

CONFIG = GatewayConfig()
TAG = '{"type": "structural_tag", "format": {"type": "const_string", "value": "Paris"}}'
PARSER = ToolOptions("hermes", True)
WEATHER = {
    "type": "function",
    "function": {
        "name": "weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


def chat(**kw) -> ChatRequest:
    body = {"model": "m@prod", "messages": [{"role": "user", "content": "hi"}], **kw}
    return validate(ChatRequest, body, CONFIG)


def comp(**kw) -> CompletionRequest:
    return validate(CompletionRequest, {"model": "m@1", "prompt": "a", **kw}, CONFIG)


def test_a_plain_request_carries_openais_defaults_and_no_sampling_block() -> None:
    fields = event_fields(chat(), ToolOptions())
    assert fields == {
        "temperature": 1.0,
        "top_p": 1.0,
        "seed": None,
        "stop": [],
        "n": 1,
        "logprobs": False,
        "sampling": None,
    }
    assert max_tokens_of(chat(), 256) == 256  # MinT's chat default (vLLM: the context left)
    assert max_tokens_of(chat(max_tokens=9, max_completion_tokens=5), 256) == 5
    assert max_tokens_of(comp(), 256) == 16  # OpenAI's and vLLM's completions default
    assert max_tokens_of(comp(max_tokens=0, echo=True), 256) == 1  # echo alone: vLLM asks 1


def test_vllms_sampling_fields_travel_in_sampling() -> None:
    req = chat(
        top_k=5,
        min_p=0.1,
        presence_penalty=0.5,
        frequency_penalty=-0.5,
        repetition_penalty=1.2,
        logit_bias={"7": 300.0, "8": -1.0},
        min_tokens=2,
        ignore_eos=True,
        stop_token_ids=[2, 3],
        include_stop_str_in_output=True,
        skip_special_tokens=False,
        bad_words=["no"],
        allowed_token_ids=[1, 2],
        logprobs=True,
        top_logprobs=3,
        prompt_logprobs=1,
        truncate_prompt_tokens=-1,
    )
    assert options(req, ToolOptions()) == SamplingOptions(
        top_k=5,
        min_p=0.1,
        presence_penalty=0.5,
        frequency_penalty=-0.5,
        repetition_penalty=1.2,
        logit_bias={7: 100.0, 8: -1.0},  # clamped to [-100, 100] as vLLM does
        min_tokens=2,
        ignore_eos=True,
        stop_token_ids=[2, 3],
        include_stop_str_in_output=True,
        skip_special_tokens=False,
        bad_words=["no"],
        allowed_token_ids=[1, 2],
        top_logprobs=3,
        prompt_logprobs=1,
        truncate_prompt_tokens=-1,
    )
    assert event_fields(req, ToolOptions())["logprobs"] is True


def test_logprobs_k_and_echo_ask_for_token_strings_and_prompt_logprobs() -> None:
    # chat logprobs with no alternatives still asks for the tokens' strings (top_logprobs 0)
    assert options(chat(logprobs=True), ToolOptions()) == SamplingOptions(top_logprobs=0)
    # completions: logprobs=k; echo asks the prompt's logprobs too (vLLM: prompt_logprobs=k)
    assert options(comp(logprobs=2), ToolOptions()) == SamplingOptions(top_logprobs=2)
    assert options(comp(logprobs=2, echo=True), ToolOptions()) == SamplingOptions(
        top_logprobs=2, prompt_logprobs=2
    )
    # vLLM's chat echo asks prompt logprobs of top_logprobs (0 by default)
    assert options(chat(echo=True), ToolOptions()) == SamplingOptions(prompt_logprobs=0)


@pytest.mark.parametrize(
    ("kw", "expected"),
    [
        ({"response_format": {"type": "json_object"}}, StructuredOutput(json_object=True)),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "integer"}},
                }
            },
            StructuredOutput(json_schema={"type": "integer"}),
        ),
        ({"structured_outputs": {"regex": "[ab]+"}}, StructuredOutput(regex="[ab]+")),
        ({"structured_outputs": {"choice": ["yes", "no"]}}, StructuredOutput(choice=["yes", "no"])),
        (
            {"structured_outputs": {"grammar": 'root ::= "a"'}},
            StructuredOutput(grammar='root ::= "a"'),
        ),
        (
            {"structured_outputs": {"json": '{"type": "string"}'}},
            StructuredOutput(json_schema={"type": "string"}),
        ),
        ({"structured_outputs": {"json_object": True}}, StructuredOutput(json_object=True)),
        # response_format wins over structured_outputs of the same kind (vLLM's replace)
        (
            {
                "structured_outputs": {"json": {"type": "string"}},
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "integer"}},
                },
            },
            StructuredOutput(json_schema={"type": "integer"}),
        ),
        ({"response_format": {"type": "text"}}, None),
        # a structural tag travels as vLLM hands it over: JSON text (the engine checks it)
        (
            {"structured_outputs": {"structural_tag": TAG}},
            StructuredOutput(structural_tag=TAG),
        ),
        (
            {"response_format": json.loads(TAG)},
            StructuredOutput(structural_tag=json.dumps(json.loads(TAG))),
        ),
        (
            {"structured_outputs": {"json_object": True, "disable_any_whitespace": True}},
            StructuredOutput(json_object=True, disable_any_whitespace=True),
        ),
    ],
)
def test_structured_outputs_from_the_request(kw: dict, expected) -> None:
    for req in (chat(**kw), comp(**kw)):
        got = options(req, ToolOptions())
        assert (got.structured if got else None) == expected


@pytest.mark.parametrize(
    ("kw", "param", "fragment"),
    [
        ({"structured_outputs": {}}, "structured_outputs", "none are specified"),
        (
            {"structured_outputs": {"regex": "a"}, "response_format": {"type": "json_object"}},
            "structured_outputs",
            "multiple are specified",
        ),
        ({"structured_outputs": {"json": "{not json"}}, "structured_outputs", "not valid JSON"),
        ({"structured_outputs": {"json": "[1]"}}, "structured_outputs", "JSON object"),
        (
            {"structured_outputs": {"regex": "a", "disable_additional_properties": True}},
            "structured_outputs.disable_additional_properties",
            "not supported by MinT",
        ),
        ({"structured_outputs": {"regex": "a" * 5000}}, "structured_outputs.regex", "MinT limit"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
            "response_format",
            "none are specified",
        ),
    ],
)
def test_structured_outputs_the_engines_cannot_take_are_400s(kw, param, fragment) -> None:
    with pytest.raises(BadRequest, match=re.escape(fragment)) as e:
        options(chat(**kw), ToolOptions())
    assert e.value.param == param


@pytest.mark.parametrize(
    ("kw", "param", "message"),
    [
        # vllm serve's own messages for the values the contract cannot carry
        ({"temperature": -1}, "temperature", "temperature must be non-negative, got -1.0."),
        ({"temperature": 2.5}, "temperature", "temperature must be in [0, 2], got 2.5."),
        ({"top_p": 0}, "top_p", "top_p must be in (0, 1], got 0.0."),
        ({"n": 0}, "n", "n must be at least 1, got 0."),
        ({"max_tokens": 0}, "max_tokens", "max_tokens must be at least 1, got 0."),
        ({"max_completion_tokens": -3}, "max_completion_tokens", "must be at least 1, got -3."),
        ({"stop": ["a", ""]}, "stop", "stop cannot contain an empty string."),
        ({"bad_words": [""]}, "bad_words", "bad_words cannot contain an empty string."),
        ({"allowed_token_ids": [-1]}, "allowed_token_ids", "out-of-vocab token id!"),
        ({"logit_bias": {"x": 1.0}}, "logit_bias", "cannot be converted to integer token IDs"),
        # MinT's limits (the contract's bounds)
        ({"stop": ["x" * 300]}, "stop", "a MinT limit"),
        ({"stop_token_ids": [-1]}, "stop_token_ids", "a MinT limit"),
        ({"top_k": 2**40}, "top_k", "a MinT limit"),
    ],
)
def test_values_the_contract_cannot_carry_are_400s(kw: dict, param: str, message: str) -> None:
    with pytest.raises(BadRequest, match=re.escape(message)) as e:
        req = chat(**kw)
        event_fields(req, ToolOptions())
        max_tokens_of(req, 256)
    assert e.value.param == param and e.value.status == 400


STRICT = {
    "type": "function",
    "function": {
        "name": "at",
        "strict": True,
        "parameters": {
            "type": "object",
            "properties": {"p": {"$ref": "#/$defs/P"}},
            "$defs": {"P": {"type": "string"}},
        },
    },
}
NOW = {"type": "function", "function": {"name": "now"}}
NAMED = {"type": "function", "function": {"name": "at"}}


def _vllm_serve_tag(body: dict) -> str | None:
    """The structural tag vllm serve 0.32 puts on the request (its own parser, hermes)."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.parser.abstract_parser import DelegatingParser
    from vllm.tool_parsers.hermes_tool_parser import Hermes2ProToolParser

    class Tokenizer:  # the hermes parser only asks the vocabulary, for streaming
        def get_vocab(self) -> dict[str, int]:
            return {}

    class Hermes(DelegatingParser):
        tool_parser_cls = Hermes2ProToolParser

    req = ChatCompletionRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], **body}
    )
    so = Hermes(Tokenizer(), req.tools).adjust_request(req).structured_outputs
    return so.structural_tag if so is not None else None


@pytest.mark.parametrize(
    "body",
    [
        {"tools": [WEATHER], "tool_choice": NAMED | {"function": {"name": "weather"}}},
        {"tools": [WEATHER, STRICT], "tool_choice": NAMED},
        {"tools": [WEATHER, NOW, STRICT], "tool_choice": "required"},
        {"tools": [WEATHER, NOW], "tool_choice": "required", "parallel_tool_calls": False},
        {"tools": [WEATHER, NOW], "tool_choice": "auto"},
        {"tools": [WEATHER, STRICT], "tool_choice": "auto"},
        {"tools": [WEATHER], "tool_choice": "auto", "parallel_tool_calls": False},
        {"tools": [WEATHER], "tool_choice": "none"},
        {"tools": [WEATHER], "tool_choice": "required", "response_format": {"type": "json_object"}},
    ],
    ids=lambda b: (
        f"{b['tool_choice'] if isinstance(b['tool_choice'], str) else 'named'}"
        f"-{len(b['tools'])}-{'single' if b.get('parallel_tool_calls') is False else 'many'}"
        f"{'-rf' if 'response_format' in b else ''}"
    ),
)
def test_a_tool_choice_is_constrained_with_vllm_serves_structural_tag(body: dict) -> None:
    """The same structural tag as vllm serve's own parser builds (hermes, strict tool calling,
    --tool-strict-level auto): the same grammar gives the same greedy answer."""
    got = options(chat(**body), PARSER)
    mint = got.structured.structural_tag if got and got.structured else None
    vllm = _vllm_serve_tag(body)
    assert (json.loads(mint) if mint else None) == (json.loads(vllm) if vllm else None)
    if body["tool_choice"] != "none":
        assert got.skip_special_tokens is False  # vLLM's hermes parser reads special tokens


def test_auto_with_strict_tools_and_a_response_format_keeps_the_format_alone() -> None:
    """vLLM ORs the tool tag with the format; MinT applies the format (README: tools)."""
    req = chat(tools=[STRICT], tool_choice="auto", response_format={"type": "json_object"})
    assert options(req, PARSER).structured == StructuredOutput(json_object=True)
    assert _vllm_serve_tag(
        req.model_dump(include={"tools", "tool_choice"})
        | {"response_format": {"type": "json_object"}}
    )


def test_the_ask_of_a_chat_and_of_token_prompts() -> None:
    common = {"alias": "prod", "revision": None, "expires_at": None, "stream_to": None}
    ask = build(
        chat(
            messages=[
                {"role": "developer", "content": "be brief"},
                {"role": "user", "content": "hi"},
            ]
        ),
        ["r.0"],
        common,
        default_max_tokens=32,
        tools=ToolOptions(),
        tokenizer=None,
    )
    (p,) = ask.payloads
    # no tokenizer here: the engine renders, a developer turn as system
    assert p.chat and [m.role for m in p.messages] == ["system", "user"] and p.prompt == "hi"
    assert p.max_tokens == 32
    ask = build(
        comp(prompt=[[5, 6], [7]], n=2),
        ["r.0", "r.1"],
        common,
        default_max_tokens=32,
        tools=ToolOptions(),
        tokenizer=None,
    )
    assert [(p.prompt, p.prompt_token_ids, p.n) for p in ask.payloads] == [
        ("<2 tokens>", [5, 6], 2),
        ("<1 tokens>", [7], 2),
    ]


@pytest.mark.parametrize("chat_route", [True, False])
def test_what_the_sdk_sends_comes_back_as_the_same_sampling(chat_route: bool) -> None:
    """mint.sdk's remote client writes SamplingOptions as vllm serve's body fields; the gateway
    reads them back into the same SamplingOptions (what the engine gets)."""
    from mint.sdk.sampling import openai_fields

    sent = SamplingOptions(
        top_k=5,
        min_p=0.05,
        repetition_penalty=1.1,
        logit_bias={3: -2.0},
        stop_token_ids=[2],
        bad_words=["x"],
        top_logprobs=2,
        structured=StructuredOutput(json_schema={"type": "object"}),
    )
    fields = json.loads(json.dumps(openai_fields(sent, chat=chat_route, logprobs=False)))
    body = {"model": "m@prod", **fields}
    if chat_route:
        req = validate(
            ChatRequest, {**body, "messages": [{"role": "user", "content": "x"}]}, CONFIG
        )
    else:
        req = validate(CompletionRequest, {**body, "prompt": "x"}, CONFIG)
    assert options(req, ToolOptions()) == sent


@pytest.mark.parametrize(
    "text",
    [
        "plain words",
        "Let me look.<tool_call>",
        '<tool_call>\n{"name": "weather", "arguments": {"city": "Oslo"}}\n</tool_call>',
        '<tool_call>{"name": "a", "arguments": {}}</tool_call><tool_call>{"name": "b", "arg',
        '<tool_call>\n{"name": "weather", "arguments": "Celsius"}\n<',  # cut by max_tokens
        '<tool_call>\n{"name": "weather", "arguments": {"city": "Os',
        'Sure <tool_call>{"na',
    ],
)
def test_a_streamed_answer_reads_as_vllms_streaming_hermes_parser_assembles_it(text) -> None:
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.tool_parsers.hermes_tool_parser import Hermes2ProToolParser

    from gateway.tools import hermes_streamed

    class Tokenizer:
        def get_vocab(self) -> dict[str, int]:
            return {}

    req = ChatCompletionRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": [WEATHER]}
    )
    parser = Hermes2ProToolParser(Tokenizer(), req.tools)
    content, calls = "", {}
    for i in range(1, len(text) + 1):  # one character per step, as a stream of tiny deltas
        d = parser.extract_tool_calls_streaming(
            text[: i - 1], text[:i], text[i - 1], [], [], [], req
        )
        if d is None:
            continue
        content += d.content or ""
        for tc in d.tool_calls:
            mine = calls.setdefault(tc.index, ["", ""])
            mine[0] += tc.function.name or ""
            mine[1] += tc.function.arguments or ""
    mint_content, mint_calls = hermes_streamed(text)
    assert (mint_content or "") == content
    assert [[c["function"]["name"], c["function"]["arguments"]] for c in mint_calls] == [
        calls[k] for k in sorted(calls)
    ]
