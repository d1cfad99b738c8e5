"""The trainer worker on real Kafka and Cassandra: update requests in, revisions and events out,
idempotent under redelivery."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from catalog.repository import CatalogRepository
from catalog.store import AdapterStore
from schemas import make_event
from schemas.events import LoraSpec, UpdateRequested
from streams.group import run_consumer
from streams.producer import EventProducer
from streams.records import RetryPolicy
from workers.projector import run_projector
from workers.trainer import TrainerConfig
from workers.trainer.worker import derived_id, run_trainer

TENANT, POLICY = "acme", "math-sft"


# slow: over 9 s a module here (worker processes, own services, waits); `-m "not slow"` skips it
pytestmark = pytest.mark.slow


def write_data(settings, name: str, rows: list[dict]) -> str:
    path = Path(settings.adapter_store_root) / TENANT / POLICY / "data" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path.as_uri()


def request(base: Path, data_uri: str, parent: int | None, objective: str = "sft"):
    payload = UpdateRequested(
        base_model=str(base),
        parent_revision=parent,
        objective=objective,
        data_uri=data_uri,
        steps=3,
        batch_size=4,
        learning_rate=1e-2,
        seed=0,
        lora=LoraSpec(rank=8, alpha=16, target_modules=["q_proj", "v_proj"]),
    )
    return make_event(payload, tenant=TENANT, policy=POLICY, producer="sdk/test")


def read_events(settings, topic: str) -> list:
    seen = []
    run_consumer(
        settings,
        [topic],
        f"reader-{uuid.uuid4().hex[:6]}",
        lambda env, rec: seen.append(env),
        idle_timeout_s=3,
        auto_offset_reset="earliest",
    )
    return seen


def test_updates_export_register_and_redelivery_returns_the_same_revision(
    settings, live, tiny_llama: Path
):
    sft = write_data(
        settings,
        "sft.jsonl",
        [
            {"prompt": f"question: {i} plus {i} equals? answer:", "completion": f" {2 * i}"}
            for i in range(8)
        ],
    )
    rl = write_data(
        settings,
        "rl.jsonl",
        [
            {
                "prompt": "hello",
                "completion": f" world {i}",
                "reward": float(i % 2),
                "group": i // 4,
            }
            for i in range(8)
        ],
    )
    first = request(tiny_llama, sft, None)
    second = request(tiny_llama, rl, 1, objective="rl")
    with EventProducer(settings) as producer:
        # The first request arrives three times (at-least-once redelivery), then the next one.
        producer.publish_many([first, first, second, first])
    config = TrainerConfig(base_model=str(tiny_llama))
    stats = run_trainer(
        settings, config, idle_timeout_s=4, max_records=4, retry=RetryPolicy(max_attempts=1)
    )
    assert sum(s.handled for s in stats) == 4 and sum(s.dead_lettered for s in stats) == 0

    repo = CatalogRepository(live, settings.keyspace)
    revisions = list(repo.iter_revisions(TENANT, POLICY))
    assert [r.revision for r in revisions] == [2, 1]
    assert revisions[0].parent_revision == 1

    exports = read_events(settings, "export.events")
    updates = read_events(settings, "update.results")
    # Every delivery of `first` re-published the very same export event (same id, revision).
    by_id = {}
    for env in exports:
        by_id.setdefault(env.event_id, set()).add(
            (env.payload.revision, env.payload.adapter_digest)
        )
    assert len(exports) == 4 and len(by_id) == 2
    assert by_id[derived_id(first.event_id, "export")] == {(1, revisions[1].digest)}
    assert by_id[derived_id(second.event_id, "export")] == {(2, revisions[0].digest)}
    assert {e.event_id for e in updates} == {
        derived_id(first.event_id, "update"),
        derived_id(second.event_id, "update"),
    }
    assert all(e.causation_id in (first.event_id, second.event_id) for e in exports + updates)

    # The exported revisions verify in the store against the base's fingerprint.
    store = AdapterStore.from_settings(settings)
    for rev in revisions:
        stored = store.open(rev.store_uri)
        assert stored.digest == rev.digest
    record = store.find_request(TENANT, POLICY, str(first.event_id))
    assert record["revision"] == 1 and record["loss"] < record["first_loss"]

    # The projector applies the trainer's export events to the same catalog without conflict.
    projected = run_projector(settings, idle_timeout_s=3, max_records=4)
    assert projected.handled == 4 and projected.dead_lettered == 0
    assert [r.revision for r in repo.iter_revisions(TENANT, POLICY)] == [2, 1]


def test_request_for_another_base_model_is_dead_lettered(settings, live, tiny_llama: Path):
    data = write_data(settings, "sft.jsonl", [{"prompt": "a", "completion": " b"}])
    wrong = request(Path("/models/other-base"), data, None)
    with EventProducer(settings) as producer:
        producer.publish(wrong)
    stats = run_trainer(
        settings,
        TrainerConfig(base_model=str(tiny_llama)),
        idle_timeout_s=4,
        max_records=1,
        retry=RetryPolicy(max_attempts=1),
    )
    assert stats[0].dead_lettered == 1 and stats[0].reasons == {"refused": 1}  # at once
    letters = read_events_raw(settings, "dlq")
    assert any(b"this trainer holds" in h for _, h in letters)
    assert AdapterStore.from_settings(settings).list(TENANT, POLICY) == []


def read_events_raw(settings, topic: str) -> list[tuple[bytes, bytes]]:
    from streams.clients import make_consumer
    from streams.topics import topic_for

    consumer = make_consumer(
        settings,
        group_id=f"raw-{uuid.uuid4().hex[:6]}",
        auto_offset_reset="earliest",
        consumer_timeout_ms=4000,
    )
    consumer.subscribe([topic_for(settings, topic)])
    out = [(r.value, v) for r in consumer for k, v in (r.headers or []) if k == "mint.dlq.error"]
    consumer.close()
    return out


def test_two_consumers_share_one_trainer_for_many_policies(settings, live, tiny_llama: Path):
    from workers.trainer import MultiPolicyTrainer

    rows = [{"prompt": f"the {w} model", "completion": f" {w}"} for w in ("red", "blue")]
    events = []
    for n in range(4):
        policy = f"pol-{n}"
        path = Path(settings.adapter_store_root) / TENANT / policy / "data" / "d.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        payload = UpdateRequested(
            base_model=str(tiny_llama),
            data_uri=path.as_uri(),
            steps=2,
            batch_size=2,
            learning_rate=1e-2,
            seed=n,
        )
        events.append(make_event(payload, tenant=TENANT, policy=policy, producer="sdk/test"))
    with EventProducer(settings) as producer:
        producer.publish_many(events)
    config = TrainerConfig(base_model=str(tiny_llama))
    trainer = MultiPolicyTrainer(config)
    ptrs = trainer.base_parameter_ptrs()
    stats = run_trainer(settings, config, consumers=2, idle_timeout_s=5, trainer=trainer)
    assert sum(s.handled for s in stats) == 4 and sum(s.dead_lettered for s in stats) == 0
    assert sorted(trainer.policies) == [f"{TENANT}/pol-{n}" for n in range(4)]
    assert trainer.base_parameter_ptrs() == ptrs  # four policies, still one base
    repo = CatalogRepository(live, settings.keyspace)
    for n in range(4):
        assert [r.revision for r in repo.iter_revisions(TENANT, f"pol-{n}")] == [1]


def test_a_failed_update_is_retried_from_exactly_where_it_started(settings, live, tiny_llama):
    import torch

    from workers.trainer import MultiPolicyTrainer
    from workers.trainer.worker import TrainerService

    sft = write_data(
        settings,
        "retry.jsonl",
        [
            {"prompt": f"question: {i} plus {i} equals? answer:", "completion": f" {2 * i}"}
            for i in range(8)
        ],
    )
    warm = UpdateRequested(
        base_model=str(tiny_llama),
        objective="sft",
        data_uri=sft,
        steps=2,
        batch_size=4,
        learning_rate=1e-2,
        seed=0,
        export=False,
    )
    store, repo = AdapterStore.from_settings(settings), CatalogRepository(live, settings.keyspace)

    def weights(trainer) -> list:
        return [p.detach().clone() for p in trainer.policy(f"{TENANT}/{POLICY}").params]

    def run(fail_at_step: int | None) -> list:
        warmup = make_event(warm, tenant=TENANT, policy=POLICY, producer="sdk/test")
        update = make_event(
            warm.model_copy(update={"steps": 3}), tenant=TENANT, policy=POLICY, producer="sdk/test"
        )
        trainer = MultiPolicyTrainer(TrainerConfig(base_model=str(tiny_llama)))
        with EventProducer(settings) as producer:
            service = TrainerService(trainer, store, repo, producer)
            service.handle(warmup)  # the optimizer has state before the update under test
            if fail_at_step is not None:
                real, calls = trainer.sft_step, []

                def flaky(*a, **kw):
                    calls.append(1)
                    if len(calls) == fail_at_step:
                        raise TimeoutError("store blip mid-update")
                    return real(*a, **kw)

                trainer.sft_step = flaky
                with pytest.raises(TimeoutError):
                    service.handle(update)  # two steps were taken, then it failed
                trainer.sft_step = real
            service.handle(update)  # the retry (or the only try)
            out = weights(trainer)
        trainer.close()
        return out

    clean, retried = run(None), run(fail_at_step=3)
    assert all(torch.allclose(a, b, atol=1e-6, rtol=0) for a, b in zip(clean, retried, strict=True))


def test_trainer_metrics_move_when_it_trains(settings, live, tiny_llama: Path) -> None:
    """A scrape of the trainer's /metrics (streams.health, what MINT_METRICS_PORT serves) before
    and after one update: steps, tokens and the finished update are counted."""
    from streams import health
    from tests._metrics import scrape, total

    port = health.serve(0)
    before = scrape(port)
    data = write_data(
        settings,
        "sft-metrics.jsonl",
        [
            {"prompt": f"question: {i} plus {i} equals? answer:", "completion": f" {2 * i}"}
            for i in range(8)
        ],
    )
    with EventProducer(settings) as producer:
        producer.publish(request(tiny_llama, data, None))
    stats = run_trainer(
        settings,
        TrainerConfig(base_model=str(tiny_llama)),
        idle_timeout_s=4,
        max_records=1,
        retry=RetryPolicy(max_attempts=1),
    )
    assert sum(s.handled for s in stats) == 1
    after = scrape(port)

    def moved(name: str) -> float:
        return total(after, name) - total(before, name)

    assert moved("mint_trainer_step_seconds_count") == 3  # the request's steps=3
    assert (
        moved("mint_trainer_tokens_total") > 0
        and total(after, "mint_trainer_tokens_per_second") > 0
    )
    assert moved("mint_trainer_updates_total") == 1
    assert moved("mint_consumer_records_total") >= 1
