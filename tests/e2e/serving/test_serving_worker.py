"""The serving worker on real Kafka, Cassandra and the session's vLLM engine."""

from __future__ import annotations

import random
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from catalog.projection import execute_serving_command
from schemas import make_event
from schemas.events import InferCompleted, InferFailed, PromoteCommand

from .conftest import PROMPTS


@pytest.fixture(scope="module")
def tokenizer(tiny_llama: Path):
    return AutoTokenizer.from_pretrained(tiny_llama)


def check_against_hf(stack, hf_reference, tokenizer, env, result) -> None:
    assert isinstance(result.payload, InferCompleted), result.payload
    p = result.payload
    ids = tokenizer(env.payload.prompt).input_ids
    assert p.prompt_tokens == len(ids)
    want, _ = hf_reference.greedy(stack.adapter_dirs[p.adapter_digest], ids, len(p.token_ids))
    assert p.token_ids == want, (env.payload.request_id, p.revision)
    assert len(p.token_ids) == env.payload.max_tokens or p.finish_reason == "stop"


def promote(stack, tenant: str, policy: str, revision: int) -> None:
    cmd = make_event(
        PromoteCommand(alias="prod", revision=revision),
        tenant=tenant,
        policy=policy,
        producer="test/operator",
    )
    moved = execute_serving_command(stack.repo, cmd, producer="test/controller")
    stack.producer.publish(moved)


def test_alias_move_changes_output_without_restart(
    stack, variant_factory, hf_reference, tokenizer
) -> None:
    t = f"a{uuid.uuid4().hex[:8]}"
    r1 = stack.register(t, "chat", variant_factory(101))
    r2 = stack.register(t, "chat", variant_factory(102))
    promote(stack, t, "chat", r1.revision)
    before = stack.request(t, "chat", "before", PROMPTS[0], max_tokens=6)
    got = stack.serve([before])["before"]
    assert got.payload.revision == r1.revision and got.payload.alias == "prod"
    check_against_hf(stack, hf_reference, tokenizer, before, got)

    # The resolution cache lives 600 s here: only the alias.moved event can make this change.
    seen = stack.resolver.invalidations
    promote(stack, t, "chat", r2.revision)
    stack.step_until(lambda: stack.resolver.invalidations > seen)
    # The promotion prefetched the new revision: the next request finds it warm.
    stack.step_until(lambda: stack.ws.resident(r2.digest))
    after = stack.request(t, "chat", "after", PROMPTS[0], max_tokens=6)
    got2 = stack.serve([after])["after"]
    assert got2.payload.revision == r2.revision and got2.payload.cold_load is False
    check_against_hf(stack, hf_reference, tokenizer, after, got2)
    assert got2.payload.token_ids != got.payload.token_ids
    assert stack.resolver.invalidations >= 1


def test_failed_loads_give_error_results_while_others_are_served(
    stack, variant_factory, hf_reference, tokenizer
) -> None:
    t = f"f{uuid.uuid4().hex[:8]}"
    good = stack.register(t, "good", variant_factory(201))
    corrupt = stack.register(t, "corrupt", variant_factory(202))
    weights = Path(corrupt.store_uri.removeprefix("file://")) / "adapter_model.safetensors"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0x01  # a flipped bit in the weights
    weights.write_bytes(bytes(data))
    big = stack.register(t, "big", variant_factory(203, rank=32))  # engine max_lora_rank=16
    stack.register(t, "otherbase", variant_factory(204), fingerprint="sha256:" + "ee" * 32)
    stack.repo.create_policy(t, "missing", "tiny-llama")
    gone = stack.repo.register_revision(
        t,
        "missing",
        digest="sha256:" + "5" * 64,
        store_uri=stack.store.uri_for(t, "missing", "sha256:" + "5" * 64),
    )
    envs = []
    for i in range(3):
        envs.append(stack.request(t, "good", f"good-{i}", PROMPTS[i], revision=good.revision))
        envs.append(stack.request(t, "corrupt", f"corrupt-{i}", PROMPTS[i], revision=1))
    envs.append(stack.request(t, "big", "big", PROMPTS[0], revision=big.revision))
    envs.append(stack.request(t, "otherbase", "otherbase", PROMPTS[0], revision=1))
    envs.append(stack.request(t, "missing", "missing", PROMPTS[0], revision=gone.revision))
    envs.append(stack.request(t, "nosuch", "nosuch", PROMPTS[0]))
    # Its caller gave up (the gateway's deadline passed): answered, but nothing loaded for it.
    stack.register(t, "abandoned", variant_factory(205))
    late = stack.request(t, "abandoned", "abandoned", PROMPTS[0])
    envs.append(
        late.model_copy(
            update={
                "payload": late.payload.model_copy(
                    update={"expires_at": datetime.now(UTC) - timedelta(seconds=1)}
                )
            }
        )
    )
    got = stack.serve(envs)
    for i in range(3):
        check_against_hf(stack, hf_reference, tokenizer, envs[2 * i], got[f"good-{i}"])
        bad = got[f"corrupt-{i}"].payload
        assert isinstance(bad, InferFailed) and bad.stage == "load"
        assert "AdapterDigestMismatch" in bad.error and "digest" in bad.error
    expected = {
        "big": ("load", "RankTooLarge"),
        "otherbase": ("load", "WrongBaseModel"),
        "missing": ("load", "AdapterMissing"),
        "nosuch": ("resolve", "nosuch"),
        "abandoned": ("expired", "expires_at"),
    }
    for rid, (stage, text) in expected.items():
        p = got[rid].payload
        assert isinstance(p, InferFailed), (rid, p)
        assert p.stage == stage and text in p.error, (rid, p.error)
    # The corrupted adapter was loaded once for its three waiting requests (they waited together),
    # and nothing was loaded for the abandoned request.
    assert stack.core.stats["load_requests"] == 5


def test_200_adapters_mixed_workload_with_4_gpu_slots(
    stack, variant_factory, hf_reference, tokenizer
) -> None:
    assert stack.engine.config.max_loras == 4 and stack.engine.config.max_cpu_loras == 8
    t = f"m{uuid.uuid4().hex[:8]}"
    revs = []
    for i in range(200):
        policy = f"p{i % 20}"
        revs.append((policy, stack.register(t, policy, variant_factory(1000 + i))))
    for k in range(20):
        promote(stack, t, f"p{k}", revs[k][1].revision)  # alias traffic for the first 20
    rng = random.Random(7)
    envs = []
    for i, (policy, rev) in enumerate(revs):
        envs.append(stack.request(t, policy, f"r{i}", rng.choice(PROMPTS), revision=rev.revision))
    for j in range(100):  # a skewed tail: hot adapters get many requests
        i = min(int(rng.paretovariate(1.2)) - 1, 199)
        policy, rev = revs[i]
        envs.append(stack.request(t, policy, f"hot{j}", rng.choice(PROMPTS), revision=rev.revision))
    for j in range(20):
        envs.append(stack.request(t, f"p{j}", f"alias{j}", rng.choice(PROMPTS)))
    rng.shuffle(envs)
    got = stack.serve(envs, timeout_s=600)
    served = set()
    for env in envs:
        res = got[env.payload.request_id]
        check_against_hf(stack, hf_reference, tokenizer, env, res)
        served.add(res.payload.adapter_digest)
    assert len(served) == 200
    c = stack.ws.counters
    assert c.loads >= 200 and c.evictions >= 200 - 8, c


def test_a_catalog_outage_delays_a_request_but_never_fails_or_dead_letters_it(
    stack, variant_factory
) -> None:
    # Cassandra stops answering for 3 s while a request resolves: the infer loop waits it out
    # with its partitions paused (the process reports not ready), then serves the request.
    import time

    from catalog.exceptions import CatalogUnavailable
    from catalog.refs import Ref
    from streams import health

    t = f"o{uuid.uuid4().hex[:8]}"
    rev = stack.register(t, "chat", variant_factory(301))
    promote(stack, t, "chat", rev.revision)
    # The engine applies the promotion's alias.moved to its cache first (else that answer, not the
    # catalog, would resolve the request and the outage would never be met).
    key, deadline = Ref(t, "chat", alias="prod"), time.monotonic() + 60
    while key not in stack.resolver._entries and time.monotonic() < deadline:
        stack.worker.step(timeout_ms=50)
    real, until, seen = stack.resolver._resolve, time.monotonic() + 3, []

    def flaky(ref: str):
        if time.monotonic() < until:
            seen.append(health.report())
            raise CatalogUnavailable("Cassandra did not answer (injected)")
        return real(ref)

    stack.resolver._resolve = flaky
    stack.resolver.invalidate(t, "chat", "prod")
    env = stack.request(t, "chat", "during-outage", PROMPTS[1], max_tokens=4)
    got = stack.serve([env])["during-outage"]
    assert isinstance(got.payload, InferCompleted) and got.payload.revision == rev.revision
    group = f"{stack.settings.topic_prefix}-serving"
    assert len(seen) >= 2 and seen[-1]["groups"][group]["waiting_out_outage"]
    assert seen[-1]["status"] == "waiting_out_outage"
    assert health.report()["status"] == "ready"
    assert stack.worker._serving.stats.transient_retries >= 2
    assert stack.worker._serving.stats.dead_lettered == 0
