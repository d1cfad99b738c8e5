"""Eviction with several consumer threads over one trainer (issue 25, defect 5): the least
recently *used* policy goes, and a policy in the middle of an update is never evicted, so no
retry resumes from half-updated weights and trains its steps a second time."""

from __future__ import annotations

import threading
from pathlib import Path

import torch

from catalog.claims import write_jsonl
from catalog.store import AdapterStore
from schemas import make_event
from schemas.events import LoraSpec, UpdateRequested
from workers.trainer import TrainerConfig
from workers.trainer.data import parse_examples
from workers.trainer.engine import MultiPolicyTrainer
from workers.trainer.exceptions import PolicyNotLoaded
from workers.trainer.policies import LoraShape
from workers.trainer.worker import TrainerService

ROWS = [
    {"prompt": f"question: {i} plus {i + 1} equals? answer:", "completion": f" {2 * i + 1}"}
    for i in range(8)
]


class Producer:
    def __init__(self) -> None:
        self.sent: list = []

    def publish_many(self, events: list) -> None:
        self.sent.extend(events)


def update(base: Path, store: AdapterStore, policy: str, steps: int):
    data = write_jsonl(store, "acme", policy, "data", "sft", ROWS)
    return make_event(
        UpdateRequested(
            base_model=str(base),
            objective="sft",
            data_uri=data,
            steps=steps,
            batch_size=4,
            learning_rate=1e-2,
            seed=0,
            export=False,
            lora=LoraSpec(rank=4, alpha=8, target_modules=["q_proj", "v_proj"]),
        ),
        tenant="acme",
        policy=policy,
        producer="test",
    )


def service(base: Path, store: AdapterStore, max_policies: int) -> TrainerService:
    trainer = MultiPolicyTrainer(
        TrainerConfig(base_model=str(base), max_policies=max_policies), store
    )
    return TrainerService(trainer, store, repo=None, producer=Producer())  # type: ignore[arg-type]


def test_an_update_in_flight_is_not_evicted_and_no_step_is_applied_twice(
    tiny_llama: Path, tmp_path: Path
) -> None:
    alone = service(tiny_llama, AdapterStore(tmp_path / "alone"), max_policies=2)
    alone.handle(update(tiny_llama, alone.store, "a", steps=3))
    want = [p.detach().clone() for p in alone.trainer.policy("acme/a").params]
    alone.trainer.close()

    store = AdapterStore(tmp_path / "store")
    svc = service(tiny_llama, store, max_policies=1)
    a, b = update(tiny_llama, store, "a", steps=3), update(tiny_llama, store, "b", steps=1)
    trainer, step = svc.trainer, svc.trainer.sft_step
    other = threading.Thread(target=svc.handle, args=(b,), name="consumer-2")

    def sft_step(policy_id, batch, lr):
        result = step(policy_id, batch, lr)
        if policy_id == "acme/a" and not other.is_alive() and other.ident is None:
            # Between a's steps, the second consumer thread's request adds policy b.
            other.start()
            other.join()
        return result

    trainer.sft_step = sft_step
    try:
        svc.handle(a)
    except PolicyNotLoaded:  # a was evicted mid-update: the consumer loop retries the request
        svc.handle(a)
    held = trainer.policy("acme/a")
    assert held.steps == 3  # its own three steps, not 1 + 3 from half-updated saved weights
    assert all(
        torch.allclose(x, y, atol=1e-6, rtol=0) for x, y in zip(held.params, want, strict=True)
    )
    assert trainer.policy("acme/b").steps == 1  # the other request was served all the same
    trainer.close()


def test_the_least_recently_used_policy_is_evicted_not_the_first_added(tiny_llama: Path) -> None:
    trainer = MultiPolicyTrainer(TrainerConfig(base_model=str(tiny_llama), max_policies=2))
    lora = LoraShape(rank=4, alpha=8, target_modules=["q_proj", "v_proj"])
    batch = trainer.collate(parse_examples(ROWS[:4], "sft"))
    trainer.add_policy("acme/a", lora, seed=0)
    trainer.add_policy("acme/b", lora, seed=1)
    trainer.sft_step("acme/a", batch, lr=1e-2)  # a trains: b is now the least recently used
    trainer.add_policy("acme/c", lora, seed=2)
    assert list(trainer.policies) == ["acme/a", "acme/c"]
    trainer.close()
