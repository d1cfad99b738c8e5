"""vLLM's sampling and structured-output settings through the SDK (direct and remote clients)
with fakes for Kafka and the gateway: keywords become InferRequested.sampling (or vLLM's body
fields), bad settings fail before anything is sent, and token logprobs come back."""

from __future__ import annotations

import json

import httpx
import pytest
from pydantic import BaseModel

from mint.sdk import InvalidSampling, MintClient, RemoteMintClient, RequestFailed
from mint.sdk.sampling import openai_fields, sampling_options
from schemas import make_event
from schemas.events import InferCompleted, InferFailed
from schemas.events.sampling import SamplingOptions, StructuredOutput, TokenLogprob

DIGEST = "sha256:" + "a" * 64
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
}


class Person(BaseModel):
    name: str
    age: int


def test_keywords_become_sampling_options() -> None:
    assert sampling_options() is None and sampling_options(top_k=None, json_object=False) is None
    opts = sampling_options(top_k=20, min_p=0.05, stop_token_ids=[2], json_schema=SCHEMA)
    assert (opts.top_k, opts.min_p, opts.stop_token_ids) == (20, 0.05, [2])
    assert opts.structured == StructuredOutput(json_schema=SCHEMA)
    # JSON text and a pydantic model class are schemas too
    assert sampling_options(json_schema=json.dumps(SCHEMA)).structured.json_schema == SCHEMA
    person = sampling_options(json_schema=Person).structured.json_schema
    assert person["required"] == ["name", "age"]
    assert sampling_options(choice=["yes", "no"]).structured.choice == ["yes", "no"]
    assert sampling_options(json_object=True).structured.json_object is True
    # keywords override sampling=, whose other fields stay
    both = sampling_options({"top_k": 5, "min_p": 0.1}, top_k=7, regex="[0-9]+")
    assert (both.top_k, both.min_p, both.structured.regex) == (7, 0.1, "[0-9]+")
    given = SamplingOptions(ignore_eos=True)
    assert sampling_options(given) == given


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"topk": 3}, r"unknown sampling setting 'topk'; the settings are top_k, "),
        ({"top_logprobs": "many"}, r"top_logprobs: Input should be a valid integer"),
        ({"regex": "a", "choice": ["b"]}, r"exactly one of .* \(got regex, choice\)"),
        ({"json_schema": "{not json"}, r"json_schema: not JSON"),
        ({"json_schema": [1, 2]}, r"json_schema: expected a JSON object \(a dict\), got list"),
        ({"choice": []}, r"choice: List should have at least 1 item"),
        ({"sampling": {"top_k": 1, "temperature": 2}}, r"sampling.temperature: Extra inputs"),
    ],
)
def test_bad_settings_name_the_field(kw, match) -> None:
    with pytest.raises(InvalidSampling, match=match) as e:
        sampling_options(**kw)
    assert isinstance(e.value, ValueError)  # callers may catch it as the stdlib error


def test_vllm_body_fields() -> None:
    opts = sampling_options(top_k=20, ignore_eos=True, top_logprobs=3, json_schema=SCHEMA)
    completions = openai_fields(opts, chat=False, logprobs=False)
    assert completions == {
        "top_k": 20,
        "ignore_eos": True,
        "structured_outputs": {"json": SCHEMA},
        "logprobs": 3,
    }
    chat = openai_fields(opts, chat=True, logprobs=False)
    assert (chat["logprobs"], chat["top_logprobs"]) == (True, 3)
    assert openai_fields(None, chat=False, logprobs=True) == {"logprobs": 0}
    assert openai_fields(None, chat=True, logprobs=False) == {}
    choice = openai_fields(sampling_options(choice=["a", "b"]), chat=True, logprobs=False)
    assert choice == {"structured_outputs": {"choice": ["a", "b"]}}


# ---------------------------------------------------------------------- the direct client


class FakeKafka:
    """MintClient's send and wait_for: keeps what was sent, answers with ``answer(request)``."""

    def __init__(self, answer) -> None:
        self.sent, self.answer = [], answer

    def client(self) -> MintClient:
        mint = MintClient.__new__(MintClient)
        mint.tenant, mint.name, mint.timeout_s = "acme", "sdk", 5.0
        mint.send = self.send  # type: ignore[method-assign]
        mint.wait_for = self.wait_for  # type: ignore[method-assign]
        return mint

    def send(self, policy, payload, caused_by_env=None):
        env = make_event(payload, tenant="acme", policy=policy, producer="sdk")
        self.sent.append(env)
        return env

    def wait_for(self, predicate, *, timeout_s=None, what="", request=None):
        env = make_event(
            self.answer(request.payload), tenant="acme", policy="extract", producer="engine"
        )
        assert predicate(env), what
        return env


def completed(req, **kw) -> InferCompleted:
    return InferCompleted(
        request_id=req.request_id,
        revision=3,
        adapter_digest=DIGEST,
        engine_id="e1",
        text='{"name": "Alice", "age": 31}',
        finish_reason="stop",
        prompt_tokens=5,
        completion_tokens=9,
        latency_ms=12.0,
        **kw,
    )


def test_direct_infer_sends_the_settings_and_returns_token_logprobs() -> None:
    top = [TokenLogprob(token_id=7, token="{", logprob=-0.1, top=[])]
    kafka = FakeKafka(lambda req: completed(req, token_logprobs=top, stop_reason=2))
    mint = kafka.client()
    r = mint.infer(
        "extract",
        "Alice is 31.",
        chat=True,
        max_tokens=64,
        seed=7,
        stop=["\n\n"],
        repetition_penalty=1.1,
        stop_token_ids=[2],
        top_logprobs=2,
        json_schema=Person,
    )
    sent = kafka.sent[0].payload
    assert (sent.chat, sent.max_tokens, sent.seed, sent.stop) == (True, 64, 7, ["\n\n"])
    assert sent.logprobs is True  # top_logprobs implies it
    assert sent.sampling.repetition_penalty == 1.1 and sent.sampling.top_logprobs == 2
    assert sent.sampling.structured.json_schema == Person.model_json_schema()
    assert Person.model_validate_json(r.text).age == 31
    assert r.token_logprobs == top and r.stop_reason == 2
    # the event as it travels: a plain JSON body a foreign producer can write too
    body = json.loads(kafka.sent[0].model_dump_json())["payload"]
    assert body["sampling"]["structured"]["json_schema"]["required"] == ["name", "age"]


def test_direct_infer_without_settings_sends_none_and_bad_ones_send_nothing() -> None:
    kafka = FakeKafka(completed)
    mint = kafka.client()
    mint.infer("extract", "hello")
    assert kafka.sent[0].payload.sampling is None and kafka.sent[0].payload.logprobs is False
    with pytest.raises(InvalidSampling, match="unknown sampling setting 'top_n'"):
        mint.infer("extract", "hello", top_n=3)  # type: ignore[call-arg]
    assert len(kafka.sent) == 1


def test_direct_infer_refused_by_vllm_raises_with_its_message() -> None:
    def refuse(req):
        return InferFailed(
            request_id=req.request_id,
            ref="acme/extract@prod",
            stage="validate",
            code="invalid_value",
            error="grammar is not valid EBNF",
            engine_id="e1",
        )

    mint = FakeKafka(refuse).client()
    with pytest.raises(RequestFailed, match=r"failed at validate \(invalid_value\): grammar is"):
        mint.infer("extract", "x", grammar="root ::= ")


# ---------------------------------------------------------------------- the remote client


def gateway(answer: dict, seen: list) -> httpx.Client:
    def handle(request: httpx.Request) -> httpx.Response:
        seen.append((request.url.path, json.loads(request.content)))
        return httpx.Response(200, json=answer, headers={"x-mint-revision": "3"})

    return httpx.Client(base_url="http://gw", transport=httpx.MockTransport(handle))


def test_remote_completions_send_vllm_fields_and_read_logprobs() -> None:
    answer = {
        "choices": [
            {
                "text": "42",
                "finish_reason": "stop",
                "stop_reason": None,
                "logprobs": {
                    "tokens": ["4", "2"],
                    "token_logprobs": [-0.5, -0.25],
                    "top_logprobs": [{"4": -0.5, "5": -1.5}, {"2": -0.25, "3": -2.0}],
                },
            }
        ],
        "usage": {"prompt_tokens": 4, "completion_tokens": 2},
    }
    seen: list = []
    mint = RemoteMintClient("http://gw", "mint_k_s", http=gateway(answer, seen))
    r = mint.infer("math", "6*7=", regex="[0-9]+", top_k=5, top_logprobs=2, seed=1)
    path, body = seen[0]
    assert path == "/v1/completions"
    assert body == {
        "model": "math@prod",
        "max_tokens": 8,
        "temperature": 0.0,
        "seed": 1,
        "top_k": 5,
        "structured_outputs": {"regex": "[0-9]+"},
        "logprobs": 2,
        "prompt": "6*7=",
    }
    assert (r.text, r.revision, r.tokens, r.logprobs) == ("42", 3, ["4", "2"], [-0.5, -0.25])
    assert r.top_logprobs[1] == {"2": -0.25, "3": -2.0} and r.raw == answer


def test_remote_chat_sends_structured_outputs_and_reads_chat_logprobs() -> None:
    content = [{"token": "{", "logprob": -0.1, "bytes": [123], "top_logprobs": []}]
    answer = {
        "choices": [
            {
                "message": {"role": "assistant", "content": '{"name": "A", "age": 3}'},
                "finish_reason": "stop",
                "stop_reason": 2,
                "logprobs": {"content": content},
            }
        ],
        "usage": {"prompt_tokens": 9, "completion_tokens": 1},
    }
    seen: list = []
    mint = RemoteMintClient("http://gw", "mint_k_s", http=gateway(answer, seen))
    r = mint.infer("extract", "Alice", chat=True, json_schema=SCHEMA, logprobs=True, revision=3)
    path, body = seen[0]
    assert path == "/v1/chat/completions" and body["model"] == "extract@3"
    assert body["structured_outputs"] == {"json": SCHEMA}
    assert (body["logprobs"], body["top_logprobs"]) == (True, 0)
    assert body["messages"] == [{"role": "user", "content": "Alice"}]
    assert json.loads(r.text)["age"] == 3 and r.stop_reason == 2
    assert (r.tokens, r.logprobs, r.top_logprobs) == (["{"], [-0.1], None)
    with pytest.raises(InvalidSampling, match="exactly one"):
        mint.infer("extract", "x", regex="a", grammar="root ::= 'a'")
    assert len(seen) == 1  # nothing sent for a bad setting
