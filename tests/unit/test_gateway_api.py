"""Parsing and validation of the gateway's requests: the model reference, the OpenAI bodies and
their bounds, the token bucket."""

from __future__ import annotations

import re

import pytest

from catalog.refs import Ref
from gateway.api import ignored_fields, parse_json, validate
from gateway.bodies import ChatRequest, CompletionRequest
from gateway.config import GatewayConfig
from gateway.errors import BadRequest, ModelNotFound
from gateway.ratelimit import RateLimiter, retry_after
from gateway.refs import parse_model

DIGEST = "sha256:" + "ab" * 32
CONFIG = GatewayConfig(max_prompt_chars=100, max_tokens=64, max_choices=4, max_messages=3)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("math@prod", Ref("acme", "math", alias="prod")),
        ("acme/math@prod", Ref("acme", "math", alias="prod")),
        ("math@3", Ref("acme", "math", revision=3)),
        ("acme/math-rl.v2@canary", Ref("acme", "math-rl.v2", alias="canary")),
        (f"math@{DIGEST}", Ref("acme", "math", digest=DIGEST)),
        (f"acme/math@{DIGEST}", Ref("acme", "math", digest=DIGEST)),
    ],
)
def test_model_forms(text: str, expected: Ref) -> None:
    assert parse_model(text, "acme") == expected


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("math", "is not one of"),
        ("gpt-4o", "is not one of"),
        ("", "is not one of"),
        ("math@", "alias '' is not valid"),
        ("math@0", "revision 0 is not valid"),
        ("Math@prod", "policy 'Math' is not a valid name"),
        ("a/b/math@prod", "tenant 'a/b' is not a valid name"),
        ("math@sha256:abc", "digest 'sha256:abc' is malformed"),
        ("math@Prod", "alias 'Prod' is not valid"),
        ("x" * 301 + "@prod", "is not one of"),
    ],
)
def test_malformed_models_are_400_naming_model(text: str, fragment: str) -> None:
    with pytest.raises(BadRequest, match=fragment) as e:
        parse_model(text, "acme")
    assert e.value.param == "model" and e.value.status == 400


@pytest.mark.parametrize("text", ["other/math@prod", "other/nosuch@1", f"globex/m@{DIGEST}"])
def test_another_tenants_model_is_404_like_a_missing_one(text: str) -> None:
    with pytest.raises(ModelNotFound) as e:
        parse_model(text, "acme")
    missing = ModelNotFound(text)
    assert e.value.status == 404 and e.value.body() == missing.body()
    assert "does not exist or you do not have access" in e.value.message


def chat(**kw) -> dict:
    return {"model": "m@prod", "messages": [{"role": "user", "content": "hi"}], **kw}


def comp(**kw) -> dict:
    return {"model": "m@1", "prompt": "a", **kw}


def test_a_valid_chat_and_completion_with_vllms_fields() -> None:
    req = validate(
        ChatRequest,
        chat(
            max_tokens=8,
            temperature=0,
            stop="\n",
            n=2,
            seed=1,
            logprobs=True,
            top_logprobs=3,
            user="u",
            stream=True,
            stream_options={"include_usage": True},
            top_k=5,
            min_p=0.1,
            repetition_penalty=1.1,
            presence_penalty=0.5,
            frequency_penalty=-0.5,
            logit_bias={"7": 3.0},
            min_tokens=2,
            ignore_eos=True,
            stop_token_ids=[2],
            include_stop_str_in_output=True,
            skip_special_tokens=False,
            bad_words=["no"],
            allowed_token_ids=[1, 2, 3],
            prompt_logprobs=0,
            truncate_prompt_tokens=100,
            response_format={"type": "json_object"},
            tools=[{"type": "function", "function": {"name": "f"}}],
            tool_choice="none",
        ),
        CONFIG,
    )
    assert req.stops() == ["\n"] and req.max_output() == 8 and req.top_logprobs == 3
    req = validate(
        ChatRequest,
        chat(
            max_completion_tokens=5,
            max_tokens=7,
            messages=[
                {"role": "developer", "content": "be brief"},
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                },
            ],
        ),
        CONFIG,
    )
    # vLLM: max_completion_tokens wins; text parts are joined by newlines
    assert req.max_output() == 5 and req.messages[1].text() == "a\nb"
    assert validate(ChatRequest, chat(), CONFIG).max_output() is None
    comp_ = validate(CompletionRequest, comp(prompt=["a", "b"], n=2, logprobs=2, echo=True), CONFIG)
    assert comp_.prompts() == ["a", "b"] and comp_.max_tokens == 16
    assert validate(CompletionRequest, comp(prompt=[1, 2, 3]), CONFIG).prompts() == [[1, 2, 3]]
    assert validate(CompletionRequest, comp(prompt=[[1], [2, 3]]), CONFIG).prompts() == [
        [1],
        [2, 3],
    ]
    assert validate(CompletionRequest, comp(max_tokens=None), CONFIG).max_tokens == 16


def test_fields_neither_vllm_nor_mint_knows_are_ignored_and_named() -> None:
    req = validate(ChatRequest, chat(frobnicate=1, best_of=3), CONFIG)
    assert ignored_fields(req) == ["best_of", "frobnicate"]


@pytest.mark.parametrize(
    ("body", "param", "fragment"),
    [
        # vllm serve's own request checks, with its messages
        (chat(stream_options={"include_usage": True}), "stream_options", "only be defined"),
        (chat(top_logprobs=2), "top_logprobs", "`logprobs` must be set to true"),
        (chat(logprobs=True, top_logprobs=-2), "top_logprobs", "positive value or -1"),
        (chat(prompt_logprobs=-3), "prompt_logprobs", "positive value or -1"),
        (chat(prompt_logprobs=1, stream=True), "prompt_logprobs", "not available when"),
        (chat(prompt_logprobs="x"), "prompt_logprobs", "must be an integer"),
        (comp(logprobs=-2), "logprobs", "positive value or -1"),
        (chat(tools=[]), "tools", "must not be an empty array"),
        (chat(tool_choice="required"), "tool_choice", "`tools` must be set"),
        (
            chat(tools=[{"type": "function", "function": {"name": "f"}}], tool_choice="sometimes"),
            "tool_choice",
            "Invalid value for `tool_choice`",
        ),
        (
            chat(
                tools=[{"type": "function", "function": {"name": "f"}}],
                tool_choice={"type": "function", "function": {"name": "g"}},
            ),
            "tool_choice",
            "does not match any of the specified `tools`",
        ),
        (
            chat(
                tools=[{"type": "function", "function": {"name": "f"}}],
                tool_choice={"type": "function", "function": {}},
            ),
            "tool_choice.function.name",
            "Expected field `name`",
        ),
        (
            chat(structured_outputs={"regex": "a", "choice": ["a"]}),
            "structured_outputs",
            "only use one kind",
        ),
        (
            chat(
                structured_outputs={"regex": "a"},
                tools=[{"type": "function", "function": {"name": "f"}}],
                tool_choice={"type": "function", "function": {"name": "f"}},
            ),
            None,
            "either use constraints for structured outputs or tools",
        ),
        (chat(response_format={"type": "json_schema"}), "response_format", "must be provided"),
        (chat(continue_final_message=True), None, "Cannot set both"),
        (chat(cache_salt="a/b"), "cache_salt", "must not contain"),
        (comp(prompt=""), "prompt", "Either prompt or prompt_embeds"),
        (comp(suffix="z"), "suffix", "FIM completion rendering"),
        (comp(suffix="z", echo=True), "suffix", "Echo is unsupported with suffix"),
        (chat(chat_template="{{ x }}"), None, "--trust-request-chat-template"),
        # types, as vLLM's pydantic models have them
        (chat(messages=[]), "messages", "at least 1 item"),
        (chat(seed=2**64), "seed", "less than or equal to"),
        (chat(truncate_prompt_tokens=-2), "truncate_prompt_tokens", "greater than or equal"),
        ({"messages": [{"role": "user", "content": "hi"}]}, "model", "Field required"),
        (comp(prompt=[1, -2]), "prompt.1", "greater than or equal to 0"),
        # text models only
        (
            chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]),
            "messages.0.content.0.type",
            "text models",
        ),
        # what vLLM honours and MinT's engines do not
        (chat(use_beam_search=True), "use_beam_search", "beam search"),
        (chat(priority=1), "priority", "priority"),
        (chat(logprob_token_ids=[1], logprobs=True), "logprob_token_ids", "not supported"),
        (comp(vllm_xargs={"a": 1}), "vllm_xargs", "not supported"),
        # this gateway's bounds (MinT rules)
        (chat(max_tokens=65), "max_tokens", "over this gateway's limit of 64"),
        (chat(max_completion_tokens=65), "max_completion_tokens", "limit of 64"),
        (chat(n=5), "n", "limit of 4"),
        (chat(messages=[{"role": "user", "content": "x" * 101}]), "messages", "limit of 100"),
        (chat(messages=[{"role": "user", "content": "a"}] * 4), "messages", "limit of 3"),
        (comp(prompt=["a"] * 5), "n", "limit of 4"),
        (comp(prompt="x" * 101), "prompt", "limit of 100"),
    ],
)
def test_bad_bodies_are_400_naming_the_field(body: dict, param: str | None, fragment: str) -> None:
    model = ChatRequest if "messages" in body else CompletionRequest
    with pytest.raises(BadRequest, match=re.escape(fragment)) as e:
        validate(model, body, CONFIG)
    assert e.value.param == param and e.value.status == 400
    assert e.value.body()["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    "body",
    [
        # refused by vllm serve before 0.32's SamplingParams, answered by MinT's engines with
        # vLLM's message: the gateway lets them through to the engine
        chat(top_k=-5),
        chat(min_p=2.0),
        chat(presence_penalty=3.0),
        chat(n=2, temperature=0),
        chat(structured_outputs={"regex": "("}),
        chat(logprobs=True, top_logprobs=50),
        chat(allowed_token_ids=[]),
        chat(logit_bias={"-1": 1.0}),
        # vLLM takes these and so does MinT now
        chat(messages=[{"role": "tool", "content": "a"}]),
        chat(messages=[{"role": "system", "content": "a"}]),
        comp(echo=True, logprobs=3),
        comp(best_of=3),
    ],
)
def test_what_vllm_takes_passes_the_gateways_checks(body: dict) -> None:
    model = ChatRequest if "messages" in body else CompletionRequest
    validate(model, body, CONFIG)


@pytest.mark.parametrize("raw", [b"{", b"[1, 2]", b"\xff\xfe", b'"text"'])
def test_bodies_that_are_not_a_json_object(raw: bytes) -> None:
    with pytest.raises(BadRequest) as e:
        parse_json(raw)
    assert e.value.code == "invalid_json"


def test_token_bucket_allows_the_burst_then_the_rate() -> None:
    now = [0.0]
    limiter = RateLimiter(clock=lambda: now[0])
    assert [limiter.take("a", 2.0, 3) for _ in range(3)] == [None] * 3
    wait = limiter.take("a", 2.0, 3)
    assert wait == pytest.approx(0.5) and retry_after(wait) == "1"
    assert limiter.take("b", 2.0, 3) is None  # tenants have their own buckets
    now[0] += 0.5
    assert limiter.take("a", 2.0, 3) is None
    assert limiter.take("a", 2.0, 3) is not None
    now[0] += 100  # refills up to the burst, not beyond
    assert [limiter.take("a", 2.0, 3) is None for _ in range(4)] == [True, True, True, False]
