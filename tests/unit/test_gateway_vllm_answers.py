"""Answers in ``vllm serve``'s shapes, through the app with a fake catalog and scripted engines:
logprobs with token strings and alternatives, echo, stop_reason, tool calls (with and without
the tool-call parser), /tokenize, /detokenize and /version, templates rendered on the gateway."""

from __future__ import annotations

import json
from pathlib import Path

import openai
import pytest
from fastapi.testclient import TestClient

from gateway import GatewayConfig, create_app
from gateway.service import Gateway
from gateway.tokenize import Tokenizers
from schemas.events import InferChoice, InferCompleted
from schemas.events.sampling import TokenLogprob, TopLogprob
from tests.unit.test_gateway_app import D1, FakeCatalog, FakeEngines

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if tools %}<tools>{{ tools | tojson }}</tools>{% endif %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
WEATHER = {
    "type": "function",
    "function": {
        "name": "weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


@pytest.fixture(scope="module")
def base_folder(tmp_path_factory) -> Path:
    """A small byte-level BPE tokenizer with a chat template (no model weights needed)."""
    from workers.models.tokenizer import save_tokenizer, train_tokenizer

    folder = tmp_path_factory.mktemp("base") / "tiny"
    tok = train_tokenizer(300, corpus_lines=300)
    tok.chat_template = CHATML
    save_tokenizer(tok, folder)
    (folder / "config.json").write_text(json.dumps({"max_position_embeddings": 512}))
    return folder


def tlp(token_id: int, token: str, lp: float, top: list[tuple[int, str, float]] = ()):
    return TokenLogprob(
        token_id=token_id,
        token=token,
        logprob=lp,
        bytes=list(token.encode()),
        top=[TopLogprob(token_id=i, token=t, logprob=v) for i, t, v in top],
    )


class ScriptedEngines(FakeEngines):
    """Answers each request with ``self.text`` (token ids 5, 6), its logprobs when asked (the
    sampled token first in ``top`` or not), prompt logprobs when asked."""

    text = "Hi!"
    stop_reason: str | int | None = None

    def answer(self, env):
        from schemas import make_event

        p = env.payload
        s = p.sampling
        tokens = None
        if p.logprobs:
            tokens = [
                tlp(5, "Hi", -0.5, [(5, "Hi", -0.5), (9, "Yo", -1.5), (8, "Hey", -2.0)]),
                tlp(6, "!", -0.25, [(7, ".", -0.1), (6, "!", -0.25)]),
            ]
        prompt_lps = None
        if s is not None and s.prompt_logprobs is not None:
            prompt_lps = [None, tlp(3, " there", -3.0, [(4, " you", -1.0)])]
        choice = InferChoice(
            index=0,
            text=self.text,
            finish_reason="stop",
            token_ids=[5, 6],
            logprobs=[-0.5, -0.25] if p.logprobs else None,
            token_logprobs=tokens,
            stop_reason=self.stop_reason,
        )
        done = InferCompleted(
            request_id=p.request_id,
            revision=1,
            adapter_digest=D1,
            engine_id="e0",
            text=choice.text,
            finish_reason="stop",
            prompt_tokens=2,
            completion_tokens=2,
            latency_ms=1.0,
            token_ids=[5, 6],
            logprobs=choice.logprobs,
            token_logprobs=tokens,
            stop_reason=self.stop_reason,
            prompt_logprobs=prompt_lps,
            prompt_token_ids=[2, 3] if prompt_lps else None,
        )
        return make_event(
            done, tenant=env.tenant, policy=env.policy, producer="serving/e0", caused_by=env
        )


class BaseCatalog(FakeCatalog):
    def __init__(self, base: Path | None) -> None:
        super().__init__()
        self.base = base

    def base_model(self, tenant, policy):
        return "tiny" if (tenant, policy) in self.policies else None


def serve(base: Path | None, **config):
    catalog, engines = BaseCatalog(base), ScriptedEngines()
    gw = Gateway(GatewayConfig(instance_id="gw-test", **config), catalog, engines)
    if base is not None:
        gw.tokenizers = Tokenizers(lambda _name: base)
    http = TestClient(create_app(gw))
    key = catalog.add_key("acme")
    http.headers["Authorization"] = f"Bearer {key}"
    oa = openai.OpenAI(
        base_url="http://testserver/v1", api_key=key, http_client=http, max_retries=0
    )
    return http, oa, engines


@pytest.fixture
def plain():
    http, oa, engines = serve(None)
    with http:
        yield http, oa, engines


@pytest.fixture
def tooled(base_folder):
    http, oa, engines = serve(base_folder, tool_call_parser="hermes", enable_auto_tool_choice=True)
    with http:
        yield http, oa, engines


def chat_body(**kw) -> dict:
    return {"model": "math@prod", "messages": [{"role": "user", "content": "hi"}], **kw}


# ---------------------------------------------------------------------- logprobs, echo


def test_chat_logprobs_carry_strings_bytes_and_vllms_alternatives(plain) -> None:
    http, _, _ = plain
    r = http.post("/v1/chat/completions", json=chat_body(logprobs=True, top_logprobs=2))
    assert r.status_code == 200, r.text
    content = r.json()["choices"][0]["logprobs"]["content"]
    assert [(c["token"], c["logprob"], c["bytes"]) for c in content] == [
        ("Hi", -0.5, [72, 105]),
        ("!", -0.25, [33]),
    ]
    # vLLM's dict order: the sampled token first, then the best others (no repeat)
    assert [t["token"] for t in content[0]["top_logprobs"]] == ["Hi", "Yo"]
    assert [t["token"] for t in content[1]["top_logprobs"]] == ["!", "."]
    r = http.post(
        "/v1/chat/completions",
        json=chat_body(logprobs=True, return_tokens_as_token_ids=True, return_token_ids=True),
    )
    choice = r.json()["choices"][0]
    assert [c["token"] for c in choice["logprobs"]["content"]] == ["token_id:5", "token_id:6"]
    assert choice["token_ids"] == [5, 6] and choice["logprobs"]["content"][0]["top_logprobs"] == []


def test_completion_logprobs_list_k_plus_one_and_offsets(plain) -> None:
    http, _, _ = plain
    r = http.post("/v1/completions", json={"model": "math@prod", "prompt": "a", "logprobs": 1})
    lp = r.json()["choices"][0]["logprobs"]
    assert lp == {
        "text_offset": [0, 2],
        "token_logprobs": [-0.5, -0.25],
        "tokens": ["Hi", "!"],
        "top_logprobs": [{"Hi": -0.5, "Yo": -1.5}, {"!": -0.25, ".": -0.1}],
    }


def test_completion_echo_prepends_the_prompt_and_its_logprobs(plain) -> None:
    http, _, engines = plain
    body = {"model": "math@prod", "prompt": "Hey", "echo": True, "logprobs": 0}
    r = http.post("/v1/completions", json=body)
    choice = r.json()["choices"][0]
    assert choice["text"] == "HeyHi!"
    sampling = engines.seen[-1].payload.sampling
    assert sampling.prompt_logprobs == 0 and sampling.top_logprobs == 0
    lp = choice["logprobs"]
    # the prompt's first token has no logprob; without a tokenizer it is named by its id
    assert lp["tokens"] == ["token_id:2", " there", "Hi", "!"]
    assert lp["token_logprobs"] == [None, -3.0, -0.5, -0.25]
    assert lp["top_logprobs"][0] is None and lp["top_logprobs"][1] == {" there": -3.0}
    assert choice["prompt_logprobs"][1]["3"]["logprob"] == -3.0
    r = http.post("/v1/completions", json={**body, "max_tokens": 0})
    assert r.json()["choices"][0]["text"] == "Hey"  # echo alone: the prompt, nothing generated
    assert engines.seen[-1].payload.max_tokens == 1


def test_stop_reason_and_ignored_fields(plain) -> None:
    http, _, engines = plain
    engines.stop_reason = "END"
    r = http.post("/v1/chat/completions", json=chat_body(stop=["END"], frobnicate=1))
    assert r.json()["choices"][0]["stop_reason"] == "END"
    assert r.headers["x-mint-ignored-fields"] == "frobnicate"
    r = http.post("/v1/chat/completions", json=chat_body(**{"ключ": 1, "a b": 2}))
    assert r.status_code == 200 and r.headers["x-mint-ignored-fields"] == "a?b,????"
    r = http.post("/v1/chat/completions", json=chat_body(request_id="mine"))
    assert r.json()["id"] == "chatcmpl-mine"


# ---------------------------------------------------------------------- tools


@pytest.mark.parametrize(
    ("choice", "message"),
    [
        ("auto", '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser'),
        (None, '"auto" tool choice requires'),  # tools given, no choice: auto, as vLLM
        ("required", 'tool_choice="required" requires --tool-call-parser to be set'),
        (
            {"type": "function", "function": {"name": "weather"}},
            'tool_choice=function "weather" requires --tool-call-parser to be set',
        ),
    ],
)
def test_without_a_tool_parser_tool_choices_are_vllms_400s(plain, choice, message) -> None:
    http, _, _ = plain
    body = chat_body(tools=[WEATHER])
    if choice is not None:
        body["tool_choice"] = choice
    r = http.post("/v1/chat/completions", json=body)
    assert r.status_code == 400 and message in r.json()["error"]["message"]
    ok = http.post("/v1/chat/completions", json=chat_body(tools=[WEATHER], tool_choice="none"))
    assert ok.status_code == 200 and "tool_calls" not in ok.json()["choices"][0]["message"]


def test_a_named_tool_is_answered_as_its_call(tooled) -> None:
    http, oa, engines = tooled
    engines.text = '<tool_call>\n{"name": "weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    r = oa.chat.completions.create(
        model="math@prod",
        messages=[{"role": "user", "content": "weather?"}],
        tools=[WEATHER],
        tool_choice={"type": "function", "function": {"name": "weather"}},
    )
    msg = r.choices[0].message
    assert msg.content == "" and r.choices[0].finish_reason == "stop"  # vLLM: named is "stop"
    (call,) = msg.tool_calls
    assert call.function.name == "weather" and call.function.arguments == '{"city": "Oslo"}'
    assert call.id.startswith("chatcmpl-tool-") and call.type == "function"
    p = engines.seen[-1].payload
    tag = json.loads(p.sampling.structured.structural_tag)  # the hermes envelope, one call
    assert tag["format"]["stop_after_first"] is True
    assert {t["begin"] for t in tag["format"]["tags"]} == {
        '<tool_call>\n{"name": "weather", "arguments": ',
        '<tool_call>{"name": "weather", "arguments": ',
    }
    # the tools reach the chat template: rendered here, sent as token ids
    assert p.prompt_token_ids and not p.chat


def test_required_and_auto_tool_calls(tooled) -> None:
    http, oa, engines = tooled
    engines.text = (
        '<tool_call>{"name": "weather", "arguments": {"city": "Kyïv"}}</tool_call>'
        '<tool_call>{"name": "weather", "arguments": {"city": "Rome"}}</tool_call>'
    )
    r = oa.chat.completions.create(
        model="math@prod",
        messages=[{"role": "user", "content": "weather?"}],
        tools=[WEATHER],
        tool_choice="required",
    )
    assert r.choices[0].finish_reason == "tool_calls" and r.choices[0].message.content == ""
    args = [c.function.arguments for c in r.choices[0].message.tool_calls]
    assert args == ['{"city": "Kyïv"}', '{"city": "Rome"}']
    engines.text = (
        'Let me look.<tool_call>{"name": "weather", "arguments": {"city": "Rome"}}</tool_call>'
    )
    r = oa.chat.completions.create(
        model="math@prod", messages=[{"role": "user", "content": "weather?"}], tools=[WEATHER]
    )
    assert r.choices[0].finish_reason == "tool_calls"
    assert r.choices[0].message.content == "Let me look."
    assert r.choices[0].message.tool_calls[0].function.arguments == '{"city": "Rome"}'
    engines.text = "no tools needed"
    r = oa.chat.completions.create(
        model="math@prod", messages=[{"role": "user", "content": "hi"}], tools=[WEATHER]
    )
    assert (
        r.choices[0].message.content == "no tools needed" and r.choices[0].finish_reason == "stop"
    )


def test_a_streamed_tool_call_comes_whole_with_its_index(tooled) -> None:
    http, oa, engines = tooled
    engines.text = '<tool_call>{"name": "weather", "arguments": {"city": "Oslo"}}</tool_call>'
    stream = oa.chat.completions.create(
        model="math@prod",
        messages=[{"role": "user", "content": "weather?"}],
        tools=[WEATHER],
        tool_choice={"type": "function", "function": {"name": "weather"}},
        stream=True,
    )
    chunks = [c for c in stream if c.choices]
    calls = [
        call
        for c in chunks
        if c.choices[0].delta.tool_calls
        for call in c.choices[0].delta.tool_calls
    ]
    (call,) = calls
    assert call.index == 0 and call.id and call.function.name == "weather"
    assert call.function.arguments == '{"city": "Oslo"}'
    assert not any(c.choices[0].delta.content for c in chunks)  # the envelope is not content
    assert chunks[-1].choices[0].finish_reason == "stop"


# ---------------------------------------------------------------------- templates, tokenize


def test_a_tool_turn_is_rendered_on_the_gateway_as_vllm_would(tooled, base_folder) -> None:
    http, _, engines = tooled
    from transformers import PreTrainedTokenizerFast

    messages = [
        {"role": "user", "content": "weather?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "weather", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
    ]
    r = http.post("/v1/chat/completions", json=chat_body(messages=messages))
    assert r.status_code == 200, r.text
    hf = PreTrainedTokenizerFast.from_pretrained(str(base_folder))
    text = hf.apply_chat_template(
        [
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": "", "tool_calls": []},
            {"role": "tool", "content": "sunny"},
        ],
        tokenize=False,
        add_generation_prompt=True,
    )
    assert engines.seen[-1].payload.prompt_token_ids == hf.encode(text, add_special_tokens=False)
    # the same through /tokenize, as vllm serve answers it
    t = http.post("/tokenize", json={"model": "math@prod", "messages": messages})
    assert t.json()["tokens"] == engines.seen[-1].payload.prompt_token_ids
    assert t.json()["max_model_len"] == 512 and t.json()["token_strs"] is None


def test_a_tool_turn_without_a_tokenizer_is_a_400_that_says_why(plain) -> None:
    http, _, _ = plain
    r = http.post(
        "/v1/chat/completions",
        json=chat_body(messages=[{"role": "tool", "content": "x"}]),
    )
    assert r.status_code == 400 and "base tokenizer" in r.json()["error"]["message"]


def test_tokenize_detokenize_and_version(tooled, base_folder) -> None:
    http, _, _ = tooled
    from transformers import PreTrainedTokenizerFast

    hf = PreTrainedTokenizerFast.from_pretrained(str(base_folder))
    r = http.post(
        "/tokenize", json={"model": "math@prod", "prompt": "the cat", "return_token_strs": True}
    )
    ids = hf.encode("the cat")
    assert r.json() == {
        "count": len(ids),
        "max_model_len": 512,
        "tokens": ids,
        "token_strs": hf.convert_ids_to_tokens(ids),
    }
    r = http.post("/detokenize", json={"model": "math@prod", "tokens": ids})
    assert r.json() == {"prompt": hf.decode(ids)}
    # vllm serve decodes an id past the vocabulary as nothing; past 32 bits is a 400 here
    r = http.post("/detokenize", json={"model": "math@prod", "tokens": [ids[0], 10**6]})
    assert r.json() == {"prompt": hf.decode([ids[0]])}
    r = http.post("/detokenize", json={"model": "math@prod", "tokens": [2**32]})
    assert r.status_code == 400 and "out of vocabulary" in r.json()["error"]["message"]
    r = http.post("/tokenize", json={"model": "globex/math@prod", "prompt": "x"})
    assert r.status_code == 404  # another tenant's policy: as a missing one
    assert http.get("/version").json() == {"version": "0.32.0"}
    no_key = http.post(
        "/tokenize", json={"model": "math@prod", "prompt": "x"}, headers={"Authorization": ""}
    )
    assert no_key.status_code == 401


def test_tokenize_needs_the_base_models_folder(plain) -> None:
    http, _, _ = plain
    r = http.post("/tokenize", json={"model": "math@prod", "prompt": "x"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "tokenizer_unavailable"
