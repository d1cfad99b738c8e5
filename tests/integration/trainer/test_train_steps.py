"""Step-level training calls (the Tinker API) through the trainer worker on real Kafka and
Cassandra: create, ten forward_backward + optim_step on one batch (the loss falls),
save_for_sampler registers a revision; a failed call is answered, never dead-lettered; a
trainer stopped between forward_backward and optim_step replays the held records."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from catalog.repository import CatalogRepository
from schemas import make_event
from schemas.events import LoraSpec
from schemas.events.steps import AdamSpec, StepDatum, TrainStepRequested
from streams.group import run_consumer
from streams.producer import EventProducer
from streams.records import RetryPolicy
from workers.trainer import TrainerConfig
from workers.trainer.worker import derived_id, run_trainer

# slow: over 9 s a module here (worker processes, own services, waits); `-m "not slow"` skips it
pytestmark = pytest.mark.slow


TENANT = "acme"
BATCH = [
    StepDatum(
        tokens=[5, 9, 13, 21, 34], target_tokens=[9, 13, 21, 34, 55], weights=[0, 1, 1, 1, 1]
    ),
    StepDatum(tokens=[7, 11, 19], target_tokens=[11, 19, 3], weights=[1, 1, 1]),
]


def step(base: Path, policy: str, op: str, **fields):
    payload = TrainStepRequested(
        request_id=f"{op}-{uuid.uuid4().hex[:8]}", op=op, base_model=str(base), **fields
    )
    return make_event(payload, tenant=TENANT, policy=policy, producer="gateway/test")


def results(settings) -> dict:
    """Answers by request id (the last one of each)."""
    seen: dict = {}
    run_consumer(
        settings,
        ["train.step.results"],
        f"reader-{uuid.uuid4().hex[:6]}",
        lambda env, rec: seen.__setitem__(env.payload.request_id, env),
        idle_timeout_s=3,
        auto_offset_reset="earliest",
    )
    return seen


def test_steps_train_and_save_a_revision_for_the_sampler(settings, live, tiny_llama: Path):
    lora = LoraSpec(rank=8, alpha=16, target_modules=["q_proj", "v_proj"])
    create = step(tiny_llama, "tinker-run", "create", lora=lora, seed=0)
    calls = [create, create]  # delivered twice: answered twice, created once
    backward = []
    for _ in range(10):
        backward.append(step(tiny_llama, "tinker-run", "forward_backward", datums=BATCH))
        calls += [
            backward[-1],
            step(tiny_llama, "tinker-run", "optim_step", adam=AdamSpec(learning_rate=1e-2)),
        ]
    save = step(tiny_llama, "tinker-run", "save_for_sampler", name="final")
    ghost = step(tiny_llama, "no-such-run", "forward", datums=BATCH)
    calls += [save, ghost]
    with EventProducer(settings) as producer:
        producer.publish_many(calls)
    stats = run_trainer(
        settings,
        TrainerConfig(base_model=str(tiny_llama)),
        idle_timeout_s=4,
        max_records=len(calls),
        retry=RetryPolicy(max_attempts=1),
    )
    assert sum(s.handled for s in stats) == len(calls)
    assert sum(s.dead_lettered for s in stats) == 0

    answers = results(settings)
    losses = [answers[c.payload.request_id].payload.loss for c in backward]
    assert losses[-1] < losses[0] * 0.9 and losses[-1] == min(losses), losses
    assert [len(x) for x in answers[backward[0].payload.request_id].payload.logprobs] == [5, 3]
    assert answers[create.payload.request_id].event_id == derived_id(create.event_id, "step")
    saved = answers[save.payload.request_id].payload
    assert saved.event_type == "train.step.completed" and saved.revision == 1
    failed = answers[ghost.payload.request_id].payload
    assert failed.event_type == "train.step.failed" and failed.stage == "policy"

    repo = CatalogRepository(live, settings.keyspace)
    [rev] = list(repo.iter_revisions(TENANT, "tinker-run"))
    assert rev.revision == 1 and rev.source_event_id == derived_id(save.event_id, "export")


def test_a_trainer_stopped_before_optim_step_replays_the_held_forward_backward(
    settings, live, tiny_llama: Path
):
    config = TrainerConfig(base_model=str(tiny_llama))
    first = [
        step(tiny_llama, "resumed", "create", seed=0),
        step(tiny_llama, "resumed", "forward_backward", datums=BATCH[:1]),
        step(tiny_llama, "resumed", "forward_backward", datums=BATCH[1:]),
    ]
    optim = step(tiny_llama, "resumed", "optim_step", adam=AdamSpec(learning_rate=1e-2))
    with EventProducer(settings) as producer:
        producer.publish_many(first)
    run_trainer(settings, config, idle_timeout_s=4, max_records=3)
    # The trainer is gone (its memory with it); the next one gets the optim_step and, from
    # the committed offset, both forward_backward calls again.
    with EventProducer(settings) as producer:
        producer.publish(optim)
    stats = run_trainer(settings, config, idle_timeout_s=4, max_records=3)
    assert sum(s.handled for s in stats) == 3 and sum(s.dead_lettered for s in stats) == 0
    done = results(settings)[optim.payload.request_id].payload
    assert done.event_type == "train.step.completed", done
    assert done.metrics["accumulated_calls"] == 2 and done.metrics["stepped"] == 1
