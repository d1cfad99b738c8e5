"""The gateway's HTTP surface with a fake catalog and fake engines (no services), driven by the
real ``openai`` client through Starlette's TestClient: response shapes, streaming, errors."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime

import openai
import pytest
import structlog
from fastapi.testclient import TestClient

from catalog.apikeys import new_key
from catalog.models import ApiKey, TenantAccess
from gateway import GatewayConfig, create_app, responses
from gateway.deltas import Answers
from gateway.directory import ModelEntry
from gateway.service import Gateway
from schemas import make_event
from schemas.events import InferChoice, InferCompleted, InferDelta, InferFailed

D1 = "sha256:" + "1" * 64
D2 = "sha256:" + "2" * 64


class FakeCatalog:
    def __init__(self) -> None:
        self.keys: dict[str, ApiKey] = {}
        self.tenants = {
            "acme": TenantAccess("acme", None, "", None, None),
            "slow": TenantAccess("slow", None, "", 1.0, 2),
        }
        self.policies = {("acme", "math"), ("globex", "math"), ("slow", "math")}
        self.digests = {("acme", "math", D2): 2}

    def add_key(self, tenant: str) -> str:
        key = new_key()
        self.keys[key.key_id] = ApiKey(
            key.key_id, tenant, "", key.kdf, key.salt, key.hash, datetime.now(UTC), "", None, None
        )
        return key.text

    def key(self, key_id):
        return self.keys.get(key_id)

    def tenant(self, tenant):
        return self.tenants.get(tenant)

    def policy_exists(self, tenant, policy):
        return (tenant, policy) in self.policies

    def revision_of_digest(self, tenant, policy, digest):
        return self.digests.get((tenant, policy, digest))

    def models(self, tenant):
        return [
            ModelEntry(f"{p}@prod", datetime(2024, 1, 1, tzinfo=UTC))
            for t, p in sorted(self.policies)
            if t == tenant
        ]


class FakeEngines:
    """Engines that answer at once: choice j of a prompt is ``re:<prompt>`` (``+j`` for j > 0);
    a streamed request gets its text in deltas of two characters first (``script`` reorders or
    drops events: it takes and returns the list of one request's events)."""

    request_prefix = "gw-test."
    healthy = True

    def __init__(self) -> None:
        self.seen: list = []
        self.bound: list[dict] = []
        self.fail_stage: str | None = None
        self.cancelled: list = []
        self.script = lambda events: events

    def start(self) -> None:
        pass

    def close(self) -> None:
        pass

    def answer(self, env):
        p = env.payload
        if self.fail_stage:
            payload = InferFailed(
                request_id=p.request_id,
                ref="x",
                stage=self.fail_stage,
                error="PolicyNotFound: acme/x does not exist",
                engine_id="e0",
            )
        else:
            revision, digest = (p.revision, D2) if p.revision else (1, D1)
            choices = [
                InferChoice(
                    index=j,
                    text=f"re:{p.prompt}" + (f"+{j}" if j else ""),
                    finish_reason="stop",
                    token_ids=[5, 6],
                    logprobs=[-0.5, -0.25] if p.logprobs else None,
                )
                for j in range(p.n)
            ]
            payload = InferCompleted(
                request_id=p.request_id,
                revision=revision,
                adapter_digest=digest,
                engine_id="e0",
                text=choices[0].text,
                finish_reason="stop",
                prompt_tokens=3,
                completion_tokens=2 * p.n,
                latency_ms=1.0,
                token_ids=[5, 6],
                alias=None if p.revision else p.alias,
                logprobs=choices[0].logprobs,
                choices=choices if p.n > 1 else None,
            )
        return make_event(
            payload, tenant=env.tenant, policy=env.policy, producer="serving/e0", caused_by=env
        )

    def deltas(self, env, final):
        out = []
        for c in responses.choices_of(final.payload):
            for seq, at in enumerate(range(0, len(c.text), 2)):
                delta = InferDelta(
                    request_id=env.payload.request_id,
                    engine_id="e0",
                    index=c.index,
                    seq=seq,
                    offset=at,
                    text=c.text[at : at + 2],
                    tokens=1,
                    revision=final.payload.revision,
                )
                out.append(
                    make_event(
                        delta,
                        tenant=env.tenant,
                        policy=env.policy,
                        producer="serving/e0",
                        caused_by=env,
                    )
                )
        return out

    async def submit(self, envs, timeout_s):
        self.seen.extend(envs)
        self.bound.append(structlog.contextvars.get_contextvars())
        return [self.answer(env) for env in envs]

    async def open(self, envs, timeout_s):
        self.seen.extend(envs)
        self.bound.append(structlog.contextvars.get_contextvars())
        answers = Answers(envs, timeout_s, on_cancel=self.cancelled.extend)
        loop = asyncio.get_running_loop()
        for k, env in enumerate(envs):
            final = self.answer(env)
            streamed = [] if self.fail_stage else self.deltas(env, final)
            for event in self.script([*streamed, final]):
                loop.call_soon(answers.put, k, event)
        return answers


@pytest.fixture
def world():
    catalog, engines = FakeCatalog(), FakeEngines()
    gw = Gateway(
        GatewayConfig(instance_id="gw-test", max_body_bytes=4096, max_choices=4), catalog, engines
    )
    with TestClient(create_app(gw)) as http:
        yield catalog, engines, http


def client(http, key: str) -> openai.OpenAI:
    return openai.OpenAI(
        base_url="http://testserver/v1", api_key=key, http_client=http, max_retries=0
    )


def test_chat_answer_names_the_revision_and_carries_the_conversation(world) -> None:
    catalog, engines, http = world
    oa = client(http, catalog.add_key("acme"))
    raw = oa.chat.completions.with_raw_response.create(
        model="math@prod",
        max_tokens=4,
        temperature=0,
        n=2,
        seed=7,
        stop=["\n"],
        messages=[
            {"role": "developer", "content": "be brief"},
            {"role": "user", "content": "first"},
            {"role": "assistant", "content": "ok"},
            {"role": "user", "content": "second"},
        ],
    )
    r = raw.parse()
    assert [c.message.content for c in r.choices] == ["re:second", "re:second+1"]
    assert r.system_fingerprint == D1 and r.model == "math@prod" and r.id.startswith("chatcmpl-")
    assert r.usage.prompt_tokens == 3 and r.usage.completion_tokens == 4
    assert raw.headers["x-mint-revision"] == "1" and raw.headers["x-mint-alias"] == "prod"
    assert raw.headers["x-mint-adapter-digest"] == D1 and raw.headers["x-mint-engine-ms"] == "1.0"
    sent = [e.payload for e in engines.seen]
    # the n choices are one request (one prefill), one seed
    assert [(p.seed, p.n) for p in sent] == [(7, 2)] and sent[0].chat and sent[0].stop == ["\n"]
    assert sent[0].stream_to is None
    assert [(m.role, m.content) for m in sent[0].messages] == [
        ("system", "be brief"),
        ("user", "first"),
        ("assistant", "ok"),
        ("user", "second"),
    ]
    # the instance's prefix (its replies); the response id names the request (gateway.ids)
    assert {p.request_id.rsplit(".", 1)[0] for p in sent} == {r.id.removeprefix("chatcmpl-")}
    assert sent[0].request_id.startswith("gw-test.")
    assert raw.headers["x-mint-request-id"] == sent[0].request_id
    cid = raw.headers["x-mint-correlation-id"]
    assert {str(e.correlation_id) for e in engines.seen} == {cid}
    assert {e.tenant for e in engines.seen} == {"acme"}


def test_defaults_follow_openai_and_pinned_digests_become_revisions(world) -> None:
    catalog, engines, http = world
    oa = client(http, catalog.add_key("acme"))
    r = oa.chat.completions.create(
        model=f"acme/math@{D2}", messages=[{"role": "user", "content": "hi"}]
    )
    p = engines.seen[-1].payload
    assert p.temperature == 1.0 and p.max_tokens == 256 and p.revision == 2 and p.top_p == 1.0
    assert r.system_fingerprint == D2


def test_streamed_chat_is_read_by_the_openai_client(world) -> None:
    catalog, engines, http = world
    oa = client(http, catalog.add_key("acme"))
    chunks = list(
        oa.chat.completions.create(
            model="math@prod",
            messages=[{"role": "user", "content": "hey"}],
            stream=True,
            max_tokens=4,
            logprobs=True,
            stream_options={"include_usage": True},
        )
    )
    # vLLM's order: the role (empty content), the deltas' text, the finish, the usage
    assert (
        chunks[0].choices[0].delta.role == "assistant" and chunks[0].choices[0].delta.content == ""
    )
    pieces = [c.choices[0].delta.content for c in chunks[1:] if c.choices]
    assert pieces == ["re", ":h", "ey", "", None]  # "": the completion's chunk with the logprobs
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].usage.total_tokens == 5 and chunks[-1].system_fingerprint == D1
    assert chunks[1].system_fingerprint is None  # the digest is known from the completion on
    lps = [c.choices[0].logprobs for c in chunks if c.choices and c.choices[0].logprobs]
    assert len(lps) == 1 and [t.token for t in lps[0].content] == ["token_id:5", "token_id:6"]
    sent = engines.seen[-1].payload
    assert sent.stream_to == "gw-test" and sent.n == 1


def test_completions_plain_and_streamed_with_logprobs(world) -> None:
    catalog, engines, http = world
    oa = client(http, catalog.add_key("acme"))
    r = oa.completions.create(model="math@3", prompt=["a", "b"], n=2, max_tokens=2, logprobs=0)
    assert [c.text for c in r.choices] == ["re:a", "re:a+1", "re:b", "re:b+1"]
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    assert r.choices[0].logprobs.token_logprobs == [-0.5, -0.25]
    assert r.usage.prompt_tokens == 6 and r.system_fingerprint == D2
    assert {e.payload.revision for e in engines.seen} == {3}
    assert all(not e.payload.chat for e in engines.seen)
    stream = oa.completions.create(model="math@prod", prompt="z", stream=True, max_tokens=2)
    assert "".join(c.choices[0].text for c in stream if c.choices) == "re:z"


def test_models_lists_only_the_callers_tenant(world) -> None:
    catalog, _, http = world
    models = client(http, catalog.add_key("acme")).models.list()
    assert [m.id for m in models.data] == ["math@prod"] and models.data[0].owned_by == "acme"


@pytest.mark.parametrize("key", ["mint_000000000000_" + "a" * 43, "sk-123", ""])
def test_bad_keys_are_401(world, key) -> None:
    catalog, engines, http = world
    with pytest.raises(openai.AuthenticationError) as e:
        client(http, key or "x").chat.completions.create(
            model="math@prod", messages=[{"role": "user", "content": "hi"}]
        )
    assert e.value.status_code == 401 and e.value.code == "invalid_api_key"
    r = http.get("/v1/models")  # no header at all
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    assert not engines.seen


def test_another_tenants_policy_is_404_exactly_like_a_missing_one(world) -> None:
    catalog, engines, http = world
    key = catalog.add_key("acme")
    bodies = {}
    for model in ("globex/math@prod", "acme/nosuch@prod", "nosuch@prod", f"math@{D1}"):
        r = http.post(
            "/v1/chat/completions",
            headers={"Authorization": f"Bearer {key}"},
            json={"model": model, "messages": [{"role": "user", "content": "hi"}]},
        )
        assert r.status_code == 404, r.text
        bodies[model] = json.dumps(r.json()).replace(model, "MODEL")
    assert len(set(bodies.values())) == 1, bodies
    engines.fail_stage = "resolve"  # the engine found no such alias: the same answer
    with pytest.raises(openai.NotFoundError) as e:
        client(http, key).chat.completions.create(
            model="math@canary", messages=[{"role": "user", "content": "hi"}]
        )
    assert json.dumps(e.value.body).replace("math@canary", "MODEL") == json.dumps(
        json.loads(next(iter(bodies.values())))["error"]
    )


def test_oversized_and_malformed_bodies_are_400(world) -> None:
    catalog, engines, http = world
    auth = {"Authorization": f"Bearer {catalog.add_key('acme')}"}
    big = {"model": "math@prod", "messages": [{"role": "user", "content": "x" * 5000}]}
    r = http.post("/v1/chat/completions", headers=auth, json=big)
    assert r.status_code == 400 and r.json()["error"]["code"] == "request_too_large"
    r = http.post("/v1/chat/completions", headers=auth, content=b"{not json")
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
    with pytest.raises(openai.BadRequestError) as e:
        client(http, auth["Authorization"][7:]).chat.completions.create(
            model="math@prod", messages=[{"role": "user", "content": "hi"}], n=5
        )
    assert e.value.param == "n" and "limit of 4" in e.value.message
    assert not engines.seen


def test_rate_limit_is_429_with_retry_after(world) -> None:
    catalog, _, http = world
    oa = client(http, catalog.add_key("slow"))  # 1 request/s, burst 2
    for _ in range(2):
        oa.chat.completions.create(model="math@prod", messages=[{"role": "user", "content": "a"}])
    with pytest.raises(openai.RateLimitError) as e:
        oa.chat.completions.create(model="math@prod", messages=[{"role": "user", "content": "a"}])
    assert e.value.status_code == 429 and int(e.value.response.headers["retry-after"]) >= 1
    # another tenant is not limited by this one's bucket
    client(http, catalog.add_key("acme")).models.list()


def test_engine_failures_map_to_statuses(world) -> None:
    catalog, engines, http = world
    oa = client(http, catalog.add_key("acme"))
    engines.fail_stage = "generate"
    with pytest.raises(openai.InternalServerError) as e:
        oa.completions.create(model="math@prod", prompt="a")
    assert e.value.status_code == 500 and "failed to generate" in e.value.message
    engines.fail_stage = "expired"  # too busy to reach it before its deadline: retry later
    r = http.post(
        "/v1/completions",
        json={"model": "math@prod", "prompt": "a"},
        headers={"Authorization": f"Bearer {catalog.add_key('acme')}"},
    )
    assert r.status_code == 503 and r.headers["Retry-After"], r.text


def test_requests_carry_the_answer_timeout_as_their_deadline(world) -> None:
    from datetime import UTC, datetime, timedelta

    catalog, engines, http = world
    before = datetime.now(UTC)
    client(http, catalog.add_key("acme")).completions.create(model="math@prod", prompt="a", n=2)
    timeout = GatewayConfig(instance_id="x").answer_timeout_s  # the world's gateway: default
    assert engines.seen[-1].payload.n == 2  # one request for the n choices
    for env in engines.seen[-1:]:
        deadline = env.payload.expires_at
        assert before + timedelta(seconds=timeout - 5) <= deadline
        assert deadline <= datetime.now(UTC) + timedelta(seconds=timeout)


def test_health_metrics_and_unknown_routes(world) -> None:
    catalog, _, http = world
    client(http, catalog.add_key("acme")).models.list()
    assert http.get("/healthz").json() == {"status": "ok", "instance": "gw-test"}
    text = http.get("/metrics").text
    assert 'mint_gateway_http_requests_total{route="/v1/models",status="200"} 1.0' in text
    assert "mint_gateway_http_request_seconds_bucket" in text
    r = http.get("/v1/nothing")
    assert r.status_code == 404 and r.json()["error"]["message"] == "Not Found"


def test_the_correlation_id_is_bound_to_the_requests_log_lines(world) -> None:
    catalog, engines, http = world
    oa = client(http, catalog.add_key("acme"))
    raw = oa.completions.with_raw_response.create(model="math@prod", prompt="a")
    cid = raw.headers["x-mint-correlation-id"]
    # what structlog merges into every log line while the engines were asked
    bound = engines.bound[-1]
    assert bound["correlation_id"] == cid and bound["tenant"] == "acme"
    assert bound["policy"] == "math" and bound["model"] == "math@prod"
    assert str(engines.seen[-1].correlation_id) == cid


def test_metrics_count_tinker_and_lifecycle_routes_by_surface() -> None:
    from gateway.app import route_label

    assert route_label("/v1/completions") == "/v1/completions"
    assert route_label("/api/v1/forward_backward") == "/api/v1 (tinker)"
    assert route_label("/mint/v1/policies/p-1/revisions") == "/mint/v1 (lifecycle)"
    assert route_label("/v1/models/x") == "other"  # ids never become label values
