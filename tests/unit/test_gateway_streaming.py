"""Streaming without services: the reconciliation of deltas and completions (never doubled,
gaps filled by the completion), the SSE stream through the real ``openai`` client (fake engines
that script the order of events), errors before and after the stream starts, cancellation on a
client's disconnect and at the deadline, and the Kafka side's routing with fake clients."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import openai
import pytest
from fastapi.testclient import TestClient

from gateway import GatewayConfig, create_app
from gateway.asks import Ask
from gateway.bodies import ChatRequest, CompletionRequest
from gateway.deltas import Answers, DeltaRouter
from gateway.errors import EngineFailed
from gateway.service import Gateway
from gateway.streaming import StreamChunks
from schemas import encode_event, make_event
from schemas.events import (
    InferCancel,
    InferChoice,
    InferCompleted,
    InferDelta,
    InferFailed,
    InferRequested,
)
from schemas.settings import MintSettings
from streams.topics import partition_for_key
from tests.unit.test_gateway_app import D1, FakeCatalog, FakeEngines, client

CHAT = [{"role": "user", "content": "hey"}]


def delta(index: int, seq: int, offset: int, text: str, rid: str = "gw.r.0") -> InferDelta:
    return InferDelta(
        request_id=rid,
        engine_id="e0",
        index=index,
        seq=seq,
        offset=offset,
        text=text,
        tokens=1,
        revision=1,
    )


def completed(*texts: str, rid: str = "gw.r.0", logprobs: bool = False) -> InferCompleted:
    choices = [
        InferChoice(
            index=j,
            text=t,
            finish_reason="stop" if j == 0 else "length",
            token_ids=[1, 2],
            logprobs=[-0.1, -0.2] if logprobs else None,
        )
        for j, t in enumerate(texts)
    ]
    return InferCompleted(
        request_id=rid,
        revision=1,
        adapter_digest=D1,
        engine_id="e0",
        text=texts[0],
        finish_reason="stop",
        prompt_tokens=4,
        completion_tokens=2 * len(texts),
        latency_ms=1.0,
        choices=choices if len(texts) > 1 else None,
        token_ids=[1, 2],
        logprobs=choices[0].logprobs,
    )


def writer(chat: bool = True, n: int = 1, prompts: int = 1, logprobs: bool = False) -> StreamChunks:
    if chat:
        req: ChatRequest | CompletionRequest = ChatRequest(
            model="math@prod", messages=[{"role": "user", "content": "hi"}], n=n, logprobs=logprobs
        )
    else:
        req = CompletionRequest(
            model="math@prod", prompt=["p"] * prompts, n=n, logprobs=0 if logprobs else None
        )
    return StreamChunks(Ask(req, []), "chatcmpl-x", 0, "math@prod", prompts, include_usage=True)


def texts(chunks: list[dict], chat: bool = True) -> dict[int, str]:
    out: dict[int, str] = {}
    for chunk in chunks:
        for c in chunk["choices"]:
            piece = c["delta"].get("content", "") if chat else c["text"]
            out[c["index"]] = out.get(c["index"], "") + piece
    return out


# ---------------------------------------------------------------- reconciliation


def test_deltas_in_order_then_the_completion_send_each_character_once() -> None:
    w = writer()
    out = w.opening() + w.delta(0, delta(0, 0, 0, "Hel")) + w.delta(0, delta(0, 1, 3, "lo"))
    out += w.completed(0, completed("Hello!"))
    assert out[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert [c["choices"][0]["delta"] for c in out[1:]] == [
        {"content": "Hel"},
        {"content": "lo"},
        {"content": "!"},  # what the deltas had not sent yet
        {},  # the finish chunk
    ]
    assert out[-1]["choices"][0]["finish_reason"] == "stop" and w.dropped == 0
    assert out[1]["system_fingerprint"] is None and out[-1]["system_fingerprint"] == D1
    assert w.closing()[0]["usage"] == {
        "prompt_tokens": 4,
        "completion_tokens": 2,
        "total_tokens": 6,
        "prompt_tokens_details": None,
    }


def test_a_gap_is_filled_by_the_completion_and_late_or_repeated_deltas_are_dropped() -> None:
    w = writer()
    out = w.delta(0, delta(0, 0, 0, "ab"))
    out += w.delta(0, delta(0, 0, 0, "ab"))  # a repeat
    out += w.delta(0, delta(0, 2, 4, "ef"))  # seq 1 ("cd") never came: a gap
    out += w.completed(0, completed("abcdefg"))
    out += w.delta(0, delta(0, 3, 6, "g"))  # after the completion
    assert texts(out) == {0: "abcdefg"} and w.dropped == 3


def test_a_completion_before_any_delta_sends_the_whole_text_once() -> None:
    w = writer(chat=False)
    out = w.completed(0, completed("whole"))
    out += w.delta(0, delta(0, 0, 0, "who"))
    assert texts(out, chat=False) == {0: "whole"} and w.opening() == []


def test_choices_and_prompts_are_indexed_as_openai_does_with_logprobs_before_the_finish() -> None:
    w = writer(chat=False, n=2, prompts=2, logprobs=True)
    out = w.delta(1, delta(1, 0, 0, "y", rid="gw.r.1")) + w.delta(0, delta(0, 0, 0, "a"))
    out += w.completed(1, completed("x", "yz", rid="gw.r.1", logprobs=True))
    out += w.completed(0, completed("ab", "cd"))
    assert texts(out, chat=False) == {0: "ab", 1: "cd", 2: "x", 3: "yz"}
    choice3 = [c["choices"][0] for c in out if c["choices"][0]["index"] == 3]
    assert [c["text"] for c in choice3] == ["y", "z", ""]  # delta, the rest with logprobs, end
    assert choice3[1]["logprobs"]["token_logprobs"] == [-0.1, -0.2]
    assert choice3[2]["finish_reason"] == "length" and choice3[2]["logprobs"] is None
    assert w.closing()[0]["usage"]["prompt_tokens"] == 8  # once per prompt, not per choice


def test_an_answer_with_fewer_choices_than_asked_is_an_engine_error() -> None:
    with pytest.raises(EngineFailed, match="n=2"):
        writer(n=2).completed(0, completed("only one"))


# ---------------------------------------------------------------- through the app


@pytest.fixture
def streams():
    catalog, engines = FakeCatalog(), FakeEngines()
    gw = Gateway(GatewayConfig(instance_id="gw-test", answer_timeout_s=2.0), catalog, engines)
    with TestClient(create_app(gw)) as http:
        yield client(http, catalog.add_key("acme")), engines


def test_n_choices_stream_as_one_request_each_role_first(streams) -> None:
    oa, engines = streams
    chunks = list(oa.chat.completions.create(model="math@prod", messages=CHAT, n=2, stream=True))
    assert [c.choices[0].delta.role for c in chunks[:2]] == ["assistant", "assistant"]
    assert [c.choices[0].index for c in chunks[:2]] == [0, 1]
    joined = {0: "", 1: ""}
    for c in chunks:
        joined[c.choices[0].index] += c.choices[0].delta.content or ""
    assert joined == {0: "re:hey", 1: "re:hey+1"}
    assert len(engines.seen) == 1 and engines.seen[0].payload.n == 2 and not engines.cancelled


def test_a_completion_read_before_its_deltas_is_not_doubled(streams) -> None:
    oa, engines = streams
    engines.script = lambda events: events[-1:] + events[:-1]  # the completion first
    stream = oa.completions.create(model="math@prod", prompt=["a", "b"], n=2, stream=True)
    got: dict[int, str] = {}
    for c in stream:
        got[c.choices[0].index] = got.get(c.choices[0].index, "") + c.choices[0].text
    assert got == {0: "re:a", 1: "re:a+1", 2: "re:b", 3: "re:b+1"}


def test_a_refusal_before_the_stream_is_a_plain_400(streams) -> None:
    oa, engines = streams

    def refuse(events):
        env = events[-1]
        failed = InferFailed(
            request_id=env.payload.request_id,
            ref="acme/math@prod",
            stage="validate",
            code="context_length_exceeded",
            error="the prompt has 300 tokens; the model's context is 256",
            engine_id="e0",
        )
        return [make_event(failed, tenant="acme", policy="math", producer="serving/e0")]

    engines.script = refuse
    with pytest.raises(openai.BadRequestError) as e:
        oa.chat.completions.create(model="math@prod", messages=CHAT, stream=True)
    assert e.value.status_code == 400 and e.value.code == "context_length_exceeded"
    assert e.value.param == "messages"


def test_a_failure_mid_stream_is_an_error_event_and_cancels_the_other_prompts(streams) -> None:
    oa, engines = streams

    def fail_second_prompt(events):
        env = events[-1]
        if env.payload.request_id.endswith(".0"):
            return events[:1]  # prompt 0: one delta, then nothing yet
        failed = InferFailed(
            request_id=env.payload.request_id,
            ref="acme/math@prod",
            stage="generate",
            error="CUDA error",
            engine_id="e0",
        )
        return [*events[:1], make_event(failed, tenant="acme", policy="math", producer="e0")]

    engines.script = fail_second_prompt
    stream = oa.completions.create(model="math@prod", prompt=["a", "b"], stream=True)
    with pytest.raises(openai.APIError, match="failed to generate"):
        list(stream)
    assert [e.payload.request_id[-2:] for e in engines.cancelled] == [".0"]


def test_no_event_by_the_deadline_is_503_and_cancels(streams) -> None:
    oa, engines = streams
    engines.script = lambda events: []
    with pytest.raises(openai.InternalServerError) as e:
        oa.chat.completions.create(model="math@prod", messages=CHAT, stream=True)
    assert e.value.status_code == 503 and e.value.code == "engine_unavailable"
    assert engines.cancelled == engines.seen


def test_a_client_that_disconnects_cancels_its_request() -> None:
    catalog, engines = FakeCatalog(), FakeEngines()
    engines.script = lambda events: events[:-1]  # deltas, and the completion never comes
    gw = Gateway(GatewayConfig(instance_id="gw-test"), catalog, engines)
    app, key = create_app(gw), catalog.add_key("acme")
    body = json.dumps({"model": "math@prod", "messages": CHAT, "stream": True}).encode()
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/chat/completions",
        "raw_path": b"/v1/chat/completions",
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"authorization", f"Bearer {key}".encode()),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
        ],
        "client": ("127.0.0.1", 5000),
        "server": ("testserver", 80),
    }

    async def scenario() -> list[bytes]:
        gone = asyncio.Event()
        inbox = [{"type": "http.request", "body": body, "more_body": False}]
        sent: list[bytes] = []

        async def receive():
            if inbox:
                return inbox.pop()
            await gone.wait()
            return {"type": "http.disconnect"}

        async def send(message):
            sent.append(message.get("body", b""))
            if sum(b.count(b'"content":"') for b in sent) >= 3:  # the role and two deltas
                gone.set()

        await asyncio.wait_for(app(scope, receive, send), 5)
        return sent

    sent = asyncio.run(scenario())
    assert b"[DONE]" not in b"".join(sent)
    assert [e.event_id for e in engines.cancelled] == [engines.seen[0].event_id]


# ---------------------------------------------------------------- the Kafka side, faked


class FakeProducer:
    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes, bytes]] = []

    def send(self, topic, value, key):
        self.sent.append((topic, value, key))
        return SimpleNamespace(add_callback=lambda fn: fn(None), add_errback=lambda fn: None)

    def close(self, timeout=None) -> None:
        pass


def test_kafka_engines_route_deltas_and_answers_and_cancel_what_is_left(monkeypatch) -> None:
    from gateway import dispatch
    from gateway.metrics import GatewayMetrics
    from schemas.registry import decode_event

    producer = FakeProducer()
    monkeypatch.setattr(dispatch, "make_producer", lambda *a, **kw: producer)
    engines = dispatch.KafkaEngines(MintSettings(topic_prefix="t1"), "gw-a", GatewayMetrics())
    assert engines.deltas.topic == "t1.infer.deltas"

    def request(k: int):
        p = InferRequested(request_id=f"gw-a.r.{k}", prompt="hi", n=2, stream_to="gw-a")
        return make_event(p, tenant="acme", policy="math", producer="gateway/gw-a")

    def record(payload, req, key: bytes = b"gw-a"):
        env = make_event(payload, tenant="acme", policy="math", producer="e0", caused_by=req)
        return SimpleNamespace(key=key, value=encode_event(env))

    async def scenario():
        envs = [request(0), request(1)]
        answers = await engines.open(envs, 5.0)
        d = delta(1, 0, 0, "re", rid="gw-a.r.0")
        engines.deltas._route(record(d, envs[0], key=b"gw-b"))  # another instance's key
        engines.deltas._route(record(d, envs[0]))
        engines.router._route(record(completed("x", "y", rid="gw-a.r.0"), envs[0]).value)
        got = [await answers.next(), await answers.next()]
        assert [(k, type(e.payload).__name__) for k, e in got] == [
            (0, "InferDelta"),
            (0, "InferCompleted"),
        ]
        answers.close()  # the client went away: request 1 is cancelled, not request 0
        engines.deltas._route(record(d, envs[0]))  # nobody listens any more
        return envs

    envs = asyncio.run(scenario())
    assert engines.deltas.counts == {"own": 1, "late": 1, "foreign": 1, "undecodable": 0}
    requests = [decode_event(v) for t, v, k in producer.sent if t == "t1.infer.requests"]
    assert [type(e.payload) for e in requests] == [InferRequested, InferRequested, InferCancel]
    cancel = requests[-1]
    assert cancel.payload.request_event_id == envs[1].event_id
    assert cancel.payload.request_id == "gw-a.r.1" and cancel.key == envs[1].key
    assert cancel.causation_id == envs[1].event_id


def test_the_deltas_follower_reads_only_its_keys_partition(monkeypatch) -> None:
    from kafka import TopicPartition

    from gateway import following

    assigned = []

    class FakeFollower:
        def __init__(self, *a, **kw) -> None:
            pass

        def partitions(self, topic):
            return [TopicPartition(topic, p) for p in range(6)]

        def assign(self, tps, start):
            assigned.extend(tps)

        def follow(self, stop, **kw):
            stop.wait(5)
            return iter(())

        def close(self) -> None:
            pass

    monkeypatch.setattr(following, "Follower", FakeFollower)
    router = DeltaRouter(MintSettings(topic_prefix="t1"), "gw-a")
    router.start()
    router.close()
    assert assigned == [TopicPartition("t1.infer.deltas", partition_for_key(b"gw-a", 6))]


def test_answers_time_out_and_close_once() -> None:
    cancelled = []

    async def scenario():
        env = make_event(
            InferRequested(request_id="gw.r.0", prompt="hi"),
            tenant="acme",
            policy="math",
            producer="gw",
        )
        answers = Answers([env], 0.05, on_cancel=cancelled.extend)
        with pytest.raises(TimeoutError):
            await answers.first()
        answers.close()
        answers.close()
        answers.put(0, env)  # after close: dropped
        return env, answers

    env, answers = asyncio.run(scenario())
    assert cancelled == [env] and answers.final == {}
