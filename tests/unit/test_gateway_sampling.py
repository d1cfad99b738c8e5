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
        ({"structured_outputs": {"structural_tag": "{}"}}, "structured_outputs", "structural tags"),
        (
            {"structured_outputs": {"regex": "a", "disable_any_whitespace": True}},
            "structured_outputs.disable_any_whitespace",
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


def test_a_named_tool_choice_constrains_to_the_tools_parameters() -> None:
    req = chat(tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "weather"}})
    got = options(req, PARSER)
    assert got.structured == StructuredOutput(json_schema=WEATHER["function"]["parameters"])
    assert got.skip_special_tokens is False  # vLLM's hermes parser reads special tokens


def test_required_constrains_to_an_array_of_calls_as_vllm_builds_it() -> None:
    plain = {"type": "function", "function": {"name": "now"}}
    defs = {
        "type": "function",
        "function": {
            "name": "at",
            "parameters": {
                "type": "object",
                "properties": {"p": {"$ref": "#/$defs/P"}},
                "$defs": {"P": {"type": "string"}},
            },
        },
    }
    req = chat(tools=[plain, defs], tool_choice="required", parallel_tool_calls=False)
    assert options(req, PARSER).structured.json_schema == {
        "type": "array",
        "minItems": 1,
        "items": {
            "type": "object",
            "anyOf": [
                {
                    "properties": {
                        "name": {"type": "string", "enum": ["now"]},
                        "parameters": {"type": "object", "properties": {}},
                    },
                    "required": ["name", "parameters"],
                },
                {
                    "properties": {
                        "name": {"type": "string", "enum": ["at"]},
                        "parameters": {
                            "type": "object",
                            "properties": {"p": {"$ref": "#/$defs/P"}},
                        },
                    },
                    "required": ["name", "parameters"],
                },
            ],
        },
        "maxItems": 1,
        "$defs": {"P": {"type": "string"}},
    }


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
