"""The gateway end to end: the real `openai` client → gateway → Kafka → vLLM engine → gateway,
on real Kafka and Cassandra (fixtures: conftest.py)."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from .conftest import GatewayProcess, chat_prompt_tokens, gateway_config, openai_client

CHAT = [
    {"role": "system", "content": "You add numbers."},
    {"role": "user", "content": "one plus one"},
    {"role": "assistant", "content": "two"},
    {"role": "user", "content": "two plus two"},
]


def test_chat_and_completions_plain_and_streamed(served, gateway_a, gw_tokenizer) -> None:
    tenant, key, revs = served
    oa = openai_client(gateway_a.url, key)
    raw = oa.chat.completions.with_raw_response.create(
        model="chat@prod", messages=CHAT, max_tokens=6, temperature=0
    )
    chat = raw.parse()
    text = chat.choices[0].message.content
    assert chat.system_fingerprint == revs[0].digest and chat.model == "chat@prod"
    assert raw.headers["x-mint-revision"] == "1" and raw.headers["x-mint-alias"] == "prod"
    assert raw.headers["x-mint-policy"] == f"{tenant}/chat"
    # the engine rendered the whole conversation with the model's chat template
    assert chat.usage.prompt_tokens == chat_prompt_tokens(gw_tokenizer, CHAT)
    assert 1 <= chat.usage.completion_tokens <= 6 and text

    stream = oa.chat.completions.create(
        model="chat@prod",
        messages=CHAT,
        max_tokens=6,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    assert chunks[-1].usage.completion_tokens == chat.usage.completion_tokens
    # the digest is known from the completion on (null before it, as vLLM's chunks)
    assert chunks[-1].system_fingerprint == revs[0].digest

    comp = oa.completions.create(
        model=f"{tenant}/chat@prod", prompt="the cat sat", max_tokens=5, temperature=0, logprobs=0
    )
    assert comp.usage.prompt_tokens == len(gw_tokenizer("the cat sat").input_ids)
    lp = comp.choices[0].logprobs
    assert len(lp.token_logprobs) == comp.usage.completion_tokens and max(lp.token_logprobs) <= 0
    streamed = oa.completions.create(
        model="chat@prod", prompt="the cat sat", max_tokens=5, temperature=0, stream=True
    )
    assert "".join(c.choices[0].text for c in streamed if c.choices) == comp.choices[0].text

    sampled = oa.completions.create(
        model="chat@prod",
        prompt="the cat sat",
        max_tokens=5,
        n=3,
        temperature=1.0,
        seed=11,
        stop=["\n"],
    )
    assert [c.index for c in sampled.choices] == [0, 1, 2]  # one request, n=3
    ids = [m.id for m in oa.models.list().data]
    assert ids == ["chat@prod"]


def test_an_alias_move_changes_the_answering_revision_without_a_restart(
    served, world, gateway_a
) -> None:
    tenant, key, revs = served
    oa = openai_client(gateway_a.url, key)

    def ask(model: str):
        return oa.completions.with_raw_response.create(
            model=model, prompt="hello world", max_tokens=4, temperature=0
        )

    before = ask("chat@prod")
    assert before.headers["x-mint-revision"] == "1"
    world.promote(tenant, "chat", revs[1].revision)
    deadline = time.monotonic() + 30
    while (now := ask("chat@prod")).headers["x-mint-revision"] != "2":
        assert time.monotonic() < deadline, "the move did not take effect in 30 s"
        time.sleep(0.2)
    assert now.parse().system_fingerprint == revs[1].digest
    assert now.parse().choices[0].text != before.parse().choices[0].text  # another adapter
    pinned = ask(f"chat@{revs[2].digest}")  # by content, and by number
    assert pinned.headers["x-mint-revision"] == "3" and "x-mint-alias" not in pinned.headers
    assert ask("chat@1").parse().choices[0].text == before.parse().choices[0].text
    world.promote(tenant, "chat", revs[0].revision)  # back, for the other tests


def test_keys_tenants_bodies_and_rates(served, world, gateway_a, gw_adapters) -> None:
    tenant, key, _ = served
    msg = [{"role": "user", "content": "hi"}]
    # 401: a made-up key, and a key revoked in the catalog (within the gateway's key TTL, 1 s)
    with pytest.raises(openai.AuthenticationError):
        openai_client(gateway_a.url, "mint_0123456789ab_" + "x" * 43).models.list()
    other, other_key = world.tenant()
    world.register(other, "secret", gw_adapters[0])
    world.promote(other, "secret", 1)
    doomed = openai_client(gateway_a.url, other_key)
    assert doomed.models.list().data[0].id == "secret@prod"
    world.access.revoke_key(other_key.split("_")[1])
    deadline = time.monotonic() + 10
    with pytest.raises(openai.AuthenticationError):
        while time.monotonic() < deadline:
            doomed.models.list()
            time.sleep(0.2)

    # 404: another tenant's policy answers exactly like a missing one
    oa = openai_client(gateway_a.url, key)
    bodies = []
    for model in (f"{other}/secret@prod", f"{other}/nothing@prod", "nothing@prod", "chat@9"):
        with pytest.raises(openai.NotFoundError) as e:
            oa.chat.completions.create(model=model, messages=msg, max_tokens=2)
        bodies.append(str(e.value.body).replace(model, "MODEL"))
    assert len(set(bodies)) == 1, bodies

    # 400: an oversized body, out-of-bounds fields, unsupported parameters
    big = {"model": "chat@prod", "messages": [{"role": "user", "content": "x" * 70_000}]}
    r = httpx.post(
        f"{gateway_a.url}/v1/chat/completions",
        json=big,
        headers={"Authorization": f"Bearer {key}"},
        timeout=30,
    )
    assert r.status_code == 400 and r.json()["error"]["code"] == "request_too_large"
    for kwargs, param in (
        ({"max_tokens": 65}, "max_tokens"),
        ({"n": 9}, "n"),
        ({"top_logprobs": 3}, "top_logprobs"),  # vllm serve's: needs logprobs true
    ):
        with pytest.raises(openai.BadRequestError) as e:
            oa.chat.completions.create(model="chat@prod", messages=msg, **kwargs)
        assert e.value.param == param

    # 429: a tenant allowed 1 request per 10 s (burst 1)
    slow, slow_key = world.tenant(rate_per_s=0.1, burst=1)
    limited = openai_client(gateway_a.url, slow_key)
    limited.models.list()
    with pytest.raises(openai.RateLimitError) as e:
        limited.models.list()
    assert int(e.value.response.headers["retry-after"]) >= 1


def test_no_engine_answer_is_503_with_retry_after(gw_settings, world, served) -> None:
    from gateway.main import ThreadedServer, build
    from streams.topics import ensure_topics

    silent = gw_settings.model_copy(update={"topic_prefix": gw_settings.topic_prefix + "-idle"})
    ensure_topics(silent, ["infer.requests", "infer.results"])  # no engine consumes these
    server = ThreadedServer(
        build(silent, gateway_config(answer_timeout_s=1.5, retry_after_s=7))
    ).start()
    try:
        _, key, _ = served
        t0 = time.monotonic()
        with pytest.raises(openai.InternalServerError) as e:
            openai_client(server.url, key).completions.create(model="chat@prod", prompt="a")
        assert e.value.status_code == 503 and e.value.response.headers["retry-after"] == "7"
        assert e.value.code == "engine_unavailable" and 1.4 < time.monotonic() - t0 < 10
    finally:
        server.stop()


def test_two_instances_each_get_only_their_own_answers(
    served, gw_settings, gateway_a, gw_tokenizer, tmp_path
) -> None:
    tenant, key, _ = served
    b = GatewayProcess(
        gw_settings, tmp_path / "gateway-b.log", "--instance-id", "gw-b", "--key-ttl", "1"
    ).wait_ready()
    try:
        # prompts of distinct token counts: an answer's prompt_tokens names its request
        prompts = [" ".join(["word"] * (k + 1)) for k in range(12)]
        lengths = [len(gw_tokenizer(p).input_ids) for p in prompts]
        assert len(set(lengths)) == len(prompts)
        router = gateway_a.gateway.engines.router
        own_before, b_before = router.counts["own"], b.metrics()
        jobs = [(gateway_a.url if i % 2 else b.url, p) for i, p in enumerate(prompts)]

        def ask(job):
            url, prompt = job
            return openai_client(url, key).completions.create(
                model="chat@prod", prompt=prompt, max_tokens=3, temperature=0
            )

        with ThreadPoolExecutor(len(jobs)) as pool:
            answers = list(pool.map(ask, jobs))
        assert [a.usage.prompt_tokens for a in answers] == lengths
        b_after = b.metrics()

        def b_count(outcome: str) -> float:
            name = f'mint_gateway_replies_total{{outcome="{outcome}"}}'
            return b_after.get(name, 0.0) - b_before.get(name, 0.0)

        assert router.counts["own"] - own_before == 6 and b_count("own") == 6
        assert router.counts["late"] == 0 and b_count("late") == 0
        assert b_count("foreign") >= 6  # B saw A's answers go by and left them
    finally:
        b.stop()


def test_a_prompt_past_the_context_and_a_hostile_body_are_400s(
    served, gateway_a, gw_tokenizer
) -> None:
    """Issue 25: the engine (max-model-len 256) refuses an over-long prompt as infer.failed
    stage validate, and the gateway answers OpenAI's 400 context_length_exceeded, not a 500;
    the engine still answers the next request. A body nested past the parser is a 400 too."""
    _, key, _ = served
    oa = openai_client(gateway_a.url, key)
    long = " ".join(["word"] * 390)  # under the gateway's 2,000 characters, over 256 tokens
    assert len(gw_tokenizer(long).input_ids) > 256
    with pytest.raises(openai.BadRequestError) as chat:
        oa.chat.completions.create(
            model="chat@prod", max_tokens=2, messages=[{"role": "user", "content": long}]
        )
    with pytest.raises(openai.BadRequestError) as completion:
        oa.completions.create(model="chat@prod", prompt=long, max_tokens=2)
    for e, param in ((chat.value, "messages"), (completion.value, "prompt")):
        assert e.code == "context_length_exceeded" and e.param == param, e.body
    assert oa.completions.create(model="chat@prod", prompt="hi", max_tokens=2).choices
    deep = b'{"model":"chat@prod","messages":' + b"[" * 3000 + b"]" * 3000 + b"}"
    r = httpx.post(
        f"{gateway_a.url}/v1/chat/completions",
        content=deep,
        timeout=30,
        headers={"Authorization": f"Bearer {key}"},
    )
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"


def _answer_on_results(settings, request_id: str, timeout_s: float = 60.0):
    """The engine's answer to ``request_id`` on infer.results (read from the beginning)."""
    from schemas.registry import decode_event
    from streams.follower import Follower
    from streams.topics import topic_for

    topic = topic_for(settings, "infer.results")
    deadline = time.monotonic() + timeout_s
    with Follower(settings, client_id="e2e-answers") as follower:
        follower.assign(follower.partitions(topic), "beginning")
        for records in follower.follow(timeout_ms=200):
            for r in records:
                if request_id.encode() in r.value:
                    env = decode_event(r.value)
                    if env.payload.request_id == request_id:
                        return env.payload
            if time.monotonic() > deadline:
                return None
    return None


def test_streams_as_generated_n_choices_and_a_disconnect_cancels(served, gw_settings) -> None:
    """Issue 27: deltas reach the client while the engine generates (several content chunks,
    the first well before the last); n choices are one request; a client that leaves mid-stream
    makes the gateway send infer.cancel and the engine answer cancelled."""
    from gateway.main import ThreadedServer, build

    _, key, _ = served
    # an instance of its own that allows long answers (gateway A caps max_tokens at 64)
    server = ThreadedServer(
        build(gw_settings, gateway_config(instance_id="gw-s", max_tokens=200))
    ).start()
    try:
        oa = openai_client(server.url, key)
        t0 = time.monotonic()
        arrivals = []
        for c in oa.chat.completions.create(
            model="chat@prod", messages=CHAT, max_tokens=32, temperature=0, stream=True
        ):
            if c.choices and c.choices[0].delta.content:
                arrivals.append((time.monotonic() - t0, c.choices[0].delta.content))
        whole = oa.chat.completions.create(
            model="chat@prod", messages=CHAT, max_tokens=32, temperature=0
        )
        assert "".join(t for _, t in arrivals) == whole.choices[0].message.content
        first, last = arrivals[0][0], arrivals[-1][0]
        print(f"{len(arrivals)} content chunks; first at {first:.3f} s, last at {last:.3f} s")
        assert len(arrivals) >= 3, arrivals
        assert last - first >= 0.25 * last, arrivals  # not all at the end

        two = list(
            oa.chat.completions.create(
                model="chat@prod", messages=CHAT, max_tokens=8, n=2, seed=5, stream=True
            )
        )
        finished = {c.choices[0].index: c.choices[0].finish_reason for c in two if c.choices}
        assert set(finished) == {0, 1} and all(finished.values())
        pair = oa.completions.create(model="chat@prod", prompt="a", n=2, max_tokens=2)
        assert [c.index for c in pair.choices] == [0, 1]

        stream = oa.completions.create(
            model="chat@prod", prompt="the cat sat", max_tokens=200, temperature=0, stream=True
        )
        chunk = next(c for c in stream if c.choices and c.choices[0].text)
        stream.close()  # the client goes away mid-answer
        request_id = f"{chunk.id.removeprefix('cmpl-')}.0"  # the response id names it
        answer = _answer_on_results(gw_settings, request_id)
        assert answer is not None and answer.event_type == "infer.failed", answer
        assert answer.stage == "expired" and answer.code == "cancelled"
    finally:
        server.stop()


def test_vllm_settings_structured_outputs_logprobs_echo_and_tokenize(
    served, gateway_a, gw_tokenizer, gw_model
) -> None:
    """Issue 33: vllm serve's request fields reach the engine and come back in its shapes: a
    structured choice and regex, top logprobs with token strings, completions echo with the
    prompt's logprobs, /tokenize and /detokenize with the base model's tokenizer, and a tool
    choice this gateway has no parser for refused with vllm serve's 400."""
    from gateway.tokenize import Tokenizers

    _, key, _ = served
    oa = openai_client(gateway_a.url, key)
    before = gateway_a.gateway.tokenizers
    gateway_a.gateway.tokenizers = Tokenizers(lambda _base: gw_model)
    try:
        chat = oa.chat.completions.create(
            model="chat@prod",
            messages=CHAT,
            max_tokens=8,
            temperature=0,
            logprobs=True,
            top_logprobs=2,
            extra_body={"structured_outputs": {"choice": ["yes", "no"]}, "top_k": 5},
        )
        choice = chat.choices[0]
        assert choice.message.content in ("yes", "no")
        tokens = choice.logprobs.content
        # the tokens' strings spell the answer (then the EOS token, which the text skips)
        assert "".join(t.token for t in tokens).startswith(choice.message.content)
        assert all(len(t.top_logprobs) == 2 and t.logprob <= 0 for t in tokens)
        regex = oa.completions.create(
            model="chat@prod",
            prompt="the cat",
            max_tokens=8,
            temperature=0,
            extra_body={"structured_outputs": {"regex": "[0-9]{3}"}},
        )
        assert regex.choices[0].text.isdigit() and len(regex.choices[0].text) == 3

        echo = oa.completions.create(
            model="chat@prod",
            prompt="the cat sat",
            max_tokens=3,
            temperature=0,
            echo=True,
            logprobs=1,
        )
        c = echo.choices[0]
        prompt_ids = gw_tokenizer("the cat sat").input_ids
        assert c.text.startswith("the cat sat")
        assert len(c.logprobs.tokens) == len(prompt_ids) + echo.usage.completion_tokens
        assert c.logprobs.token_logprobs[0] is None and c.logprobs.top_logprobs[0] is None
        assert all(len(top) <= 2 for top in c.logprobs.top_logprobs[1:])

        auth = {"Authorization": f"Bearer {key}"}
        t = httpx.post(
            f"{gateway_a.url}/tokenize",
            json={"model": "chat@prod", "prompt": "the cat sat"},
            headers=auth,
            timeout=30,
        ).json()
        assert t["tokens"] == prompt_ids and t["count"] == len(prompt_ids)
        d = httpx.post(
            f"{gateway_a.url}/detokenize",
            json={"model": "chat@prod", "tokens": prompt_ids},
            headers=auth,
            timeout=30,
        ).json()
        assert d == {"prompt": gw_tokenizer.decode(prompt_ids)}
        t = httpx.post(
            f"{gateway_a.url}/tokenize",
            json={"model": "chat@prod", "messages": CHAT},
            headers=auth,
            timeout=30,
        ).json()
        text = gw_tokenizer.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
        assert t["tokens"] == gw_tokenizer(text, add_special_tokens=False).input_ids
    finally:
        gateway_a.gateway.tokenizers = before
    with pytest.raises(openai.BadRequestError, match="requires --tool-call-parser"):
        oa.chat.completions.create(
            model="chat@prod",
            messages=CHAT,
            tools=[{"type": "function", "function": {"name": "add"}}],
            tool_choice="required",
        )
