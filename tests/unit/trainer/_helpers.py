"""Shared by the step-level trainer unit tests (the fixtures are in conftest.py): fakes of the
producer, the catalog and the consumer's deferred work, and call helpers."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from catalog.exceptions import PolicyNotFound
from catalog.models import Revision
from schemas import make_event
from schemas.events import LoraSpec
from schemas.events.steps import AdamSpec, StepDatum, TrainStepRequested
from workers.trainer import MultiPolicyTrainer
from workers.trainer.worker import TrainerService

TENANT = "acme"


class FakeProducer:
    def __init__(self) -> None:
        self.sent: list = []

    def publish_many(self, envelopes):
        self.sent.extend(envelopes)
        return [None] * len(envelopes)


class FakeCatalog:
    """register_revision idempotent by digest and source event id, like the real one."""

    def __init__(self) -> None:
        self.policies: set = set()
        self.revisions: list[Revision] = []

    def get_policy(self, tenant, policy):
        if (tenant, policy) not in self.policies:
            raise PolicyNotFound(policy)

    def create_policy(self, tenant, policy, base_model, by, at):
        self.policies.add((tenant, policy))

    def register_revision(self, tenant, policy, *, digest, store_uri, source_event_id, **kw):
        mine = [r for r in self.revisions if (r.tenant, r.policy) == (tenant, policy)]
        for r in mine:
            if r.digest == digest or r.source_event_id == source_event_id:
                return r
        rev = Revision(
            tenant,
            policy,
            len(mine) + 1,
            digest,
            store_uri,
            kw["base_model"],
            kw["parent_revision"],
            datetime.now(UTC),
            "test",
            source_event_id,
        )
        self.revisions.append(rev)
        return rev

    def get_revision(self, tenant, policy, revision):
        return next(
            r
            for r in self.revisions
            if (r.tenant, r.policy, r.revision) == (tenant, policy, revision)
        )


def call(service, policy: str, op: str, event_id=None, tenant: str = TENANT, **fields):
    env = command(service, policy, op, tenant=tenant, **fields)
    if event_id is not None:
        env = env.model_copy(update={"event_id": event_id})
    return env, service.steps.handle(env)


def answers(service, env):
    return [e for e in service.producer.sent if e.causation_id == env.event_id]


LORA = LoraSpec(rank=4, alpha=8, target_modules=["q_proj", "v_proj"])
BATCH = [
    StepDatum(
        tokens=[5, 9, 13, 21, 34], target_tokens=[9, 13, 21, 34, 55], weights=[0, 1, 1, 1, 1]
    ),
    StepDatum(tokens=[7, 11, 19], target_tokens=[11, 19, 3], weights=[1, 1, 1]),
]
ADAM = AdamSpec(learning_rate=1e-2)


def _grads(service, pid):
    return [p.grad.clone() for p in service.trainer.policy(pid).params]


class Rec:
    def __init__(self, offset: int, partition: int = 0) -> None:
        self.topic, self.partition, self.offset = "t.train.steps", partition, offset


class FakeDeferred:
    def __init__(self) -> None:
        self.held: list[tuple[int, object]] = []

    def hold(self, record, key) -> None:
        self.held.append((record.offset, key))

    def release(self, key) -> bool:
        found = any(k == key for _, k in self.held)
        self.held = [(o, k) for o, k in self.held if k != key]
        return found


def command(service, policy: str, op: str, tenant: str = TENANT, **fields):
    fields.setdefault("base_model", service.trainer.config.base_model)
    payload = TrainStepRequested(request_id=f"{op}-{uuid.uuid4().hex[:8]}", op=op, **fields)
    return make_event(payload, tenant=tenant, policy=policy, producer="gateway/test")


def restarted(service):
    """A new trainer process over the same store (nothing of the old one's memory)."""
    store = service.store
    trainer = MultiPolicyTrainer(service.trainer.config, store=store)
    return TrainerService(trainer, store, service.repo, FakeProducer(), name="trainer/test")


def _params(service, pid):
    return [p.detach().clone() for p in service.trainer.policy(pid).params]
