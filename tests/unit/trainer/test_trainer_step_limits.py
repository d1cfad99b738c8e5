"""Issue 40's trainer defects, on the tiny Llama: adapter names one per policy id, non-finite
gradients never added or applied, bounded pins (per tenant, idle expiry), bounded remembered
answers (workers/trainer/policies.py, step_compute.py, step_limits.py, steps.py)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from catalog.store import AdapterStore
from schemas.events.steps import StepDatum, TrainStepCompleted
from tests.unit.trainer._helpers import (
    ADAM,
    BATCH,
    LORA,
    TENANT,
    FakeCatalog,
    FakeDeferred,
    FakeProducer,
    Rec,
    _grads,
    _params,
    call,
    command,
)
from workers.trainer import MultiPolicyTrainer, TrainerConfig, policies
from workers.trainer.exceptions import AdapterExists
from workers.trainer.policies import LoraShape
from workers.trainer.step_limits import RememberedAnswers
from workers.trainer.worker import TrainerService

torch.set_num_threads(1)


def _optimizer_state(service, pid):
    state = service.trainer.policy(pid).backend.optimizer.state_dict()["state"]
    return {i: {k: v.clone() for k, v in s.items() if torch.is_tensor(v)} for i, s in state.items()}


def _same(a, b):
    for x, y in zip(a, b, strict=True):
        torch.testing.assert_close(x, y, rtol=0, atol=0)


def _changed(a, b) -> bool:
    return any(not torch.equal(x, y) for x, y in zip(a, b, strict=True))


# 1. Adapter names: one per policy id.


def test_policy_ids_a_character_map_joined_get_adapters_of_their_own(service):
    # acme/x-p and acme-x/p were both adapter p_acme_x_p: one tenant trained the other's.
    _, first = call(service, "x-p", "create", tenant="acme", lora=LORA, seed=0)
    _, second = call(service, "p", "create", tenant="acme-x", lora=LORA, seed=1)
    assert first.event_type == second.event_type == "train.step.completed", second
    a, b = service.trainer.policy("acme/x-p"), service.trainer.policy("acme-x/p")
    assert a.adapter != b.adapter and a.adapter.isidentifier() and len(a.adapter) == 34
    untouched = _params(service, "acme/x-p")
    call(service, "p", "forward_backward", tenant="acme-x", datums=BATCH)
    _, step = call(service, "p", "optim_step", tenant="acme-x", adam=ADAM)
    assert step.metrics["stepped"] == 1
    _same(_params(service, "acme/x-p"), untouched)
    assert _changed(_params(service, "acme-x/p"), untouched)


def test_a_parent_is_never_loaded_into_an_adapter_that_exists(service, monkeypatch):
    trainer = service.trainer
    a = trainer.add_policy(f"{TENANT}/a", LoraShape(rank=4, alpha=8), seed=0)
    with torch.no_grad():
        for p in a.params:
            p.add_(0.5)  # a's own weights (B starts at zero)
    stored = trainer.export(f"{TENANT}/a", TENANT, "a")
    weights = _params(service, f"{TENANT}/a")
    monkeypatch.setattr(policies, "_adapter_name", lambda pid: "p_same")  # a collision
    trainer.remove_policy(f"{TENANT}/a")
    trainer.add_policy(f"{TENANT}/a", LoraShape(rank=4, alpha=8), seed=0)
    fresh = _params(service, f"{TENANT}/a")
    with pytest.raises(AdapterExists, match="already in the model"):
        trainer.add_policy(f"{TENANT}/b", parent=stored, parent_revision=1)
    assert f"{TENANT}/b" not in trainer.policies
    _same(_params(service, f"{TENANT}/a"), fresh)  # not overwritten by b's parent
    assert _changed(fresh, weights)


# 2. Non-finite gradients.

# The sampler's logprob far below the policy's: exp(log π − log π_sampler) is Inf; ppo's clip
# keeps the loss finite, but the backward through the ratio is Inf·0 = NaN.
OVERFLOW = StepDatum(
    tokens=[5, 9, 13], target_tokens=[9, 13, 21], logprobs=[-1e4] * 3, advantages=[1.0] * 3
)


def test_a_ppo_step_whose_gradients_are_not_finite_is_refused_and_changes_nothing(service):
    pid = f"{TENANT}/p"
    call(service, "p", "create", lora=LORA, seed=0)
    call(service, "p", "forward_backward", datums=BATCH)
    grads, weights = _grads(service, pid), _params(service, pid)
    env, out = call(service, "p", "forward_backward", datums=[OVERFLOW], loss_fn="ppo")
    assert out.event_type == "train.step.failed" and out.stage == "compute", out
    assert "gradients are not finite" in out.reason
    assert "ppo ratio overflow: in datums[0]" in out.reason
    _same(_grads(service, pid), grads)  # exactly as before the call
    # The optim_step after it applies the good call's gradients only, and finite ones.
    _, step = call(service, "p", "optim_step", adam=ADAM)
    assert step.event_type == "train.step.completed", step
    assert step.metrics["accumulated_calls"] == 1 and math.isfinite(step.metrics["grad_norm"])
    after = _params(service, pid)
    assert all(torch.isfinite(p).all() for p in after)
    assert _changed(after, weights)
    published = [e.payload for e in service.producer.sent if e.causation_id == env.event_id]
    assert [type(a).__name__ for a in published] == ["TrainStepFailed"]


def test_optim_step_refuses_a_gradient_norm_that_is_not_finite(service):
    pid = f"{TENANT}/p"
    call(service, "p", "create", lora=LORA, seed=0)
    call(service, "p", "forward_backward", datums=BATCH)
    call(service, "p", "optim_step", adam=ADAM)  # some optimizer state to keep
    call(service, "p", "forward_backward", datums=BATCH)
    service.trainer.policy(pid).params[0].grad[0, 0] = float("inf")  # (summed to overflow)
    weights, moments = _params(service, pid), _optimizer_state(service, pid)
    _, out = call(service, "p", "optim_step", adam=ADAM)
    assert out.event_type == "train.step.failed" and out.stage == "compute", out
    assert "gradient norm" in out.reason and "were dropped" in out.reason
    _same(_params(service, pid), weights)
    after = _optimizer_state(service, pid)
    for i in moments:
        _same(after[i].values(), moments[i].values())
    assert pid not in service.trainer._pinned  # the dropped gradients pin nothing
    call(service, "p", "forward_backward", datums=BATCH)
    _, again = call(service, "p", "optim_step", adam=ADAM)
    assert again.metrics["stepped"] == 1 and again.metrics["accumulated_calls"] == 1


def test_a_forward_of_the_same_datum_answers_finite_values(service):
    call(service, "p", "create", lora=LORA, seed=0)  # (no backward: nothing overflows)
    _, out = call(service, "p", "forward", datums=[OVERFLOW], loss_fn="ppo")
    assert out.event_type == "train.step.completed"
    TrainStepCompleted.model_validate(out.model_dump())
    assert all(math.isfinite(x) for row in out.logprobs for x in row)


# 3. Bounded pins.


@pytest.fixture
def limited(tiny: Path, tmp_path: Path):
    config = TrainerConfig(
        base_model=str(tiny), max_policies=6, max_pinned_per_tenant=2, pinned_idle_s=900
    )
    store = AdapterStore(tmp_path / "store")
    trainer = MultiPolicyTrainer(config, store=store)
    yield TrainerService(trainer, store, FakeCatalog(), FakeProducer(), name="trainer/test")
    trainer.close()


def test_a_tenant_pins_at_most_max_pinned_per_tenant_policies(limited):
    for name in ("a", "b", "c"):
        call(limited, name, "create", lora=LORA, seed=0)
    call(limited, "c", "create", tenant="other", lora=LORA, seed=0)
    for name in ("a", "b"):
        _, out = call(limited, name, "forward_backward", datums=BATCH)
        assert out.event_type == "train.step.completed"
    _, third = call(limited, "c", "forward_backward", datums=BATCH)
    assert third.event_type == "train.step.failed" and third.stage == "policy", third
    assert "already has gradients waiting for an optim_step on 2 models" in third.reason
    assert "max_pinned_per_tenant=2" in third.reason and "send optim_step" in third.reason
    assert f"{TENANT}/c" not in limited.trainer._pinned
    assert all(p.grad is None for p in limited.trainer.policy(f"{TENANT}/c").params)
    _, more = call(limited, "a", "forward_backward", datums=BATCH)  # a pinned one: fine
    assert more.event_type == "train.step.completed"
    _, theirs = call(limited, "c", "forward_backward", tenant="other", datums=BATCH)
    assert theirs.event_type == "train.step.completed"  # another tenant's own count
    call(limited, "a", "optim_step", adam=ADAM)
    _, now = call(limited, "c", "forward_backward", datums=BATCH)
    assert now.event_type == "train.step.completed"


def test_waiting_gradients_idle_for_pinned_idle_s_are_dropped_and_the_optim_step_told(limited):
    pid, clock = f"{TENANT}/p", [1000.0]
    limited.steps._waiting.clock = lambda: clock[0]
    held = FakeDeferred()
    limited.steps.handle(command(limited, "p", "create", lora=LORA, seed=0), Rec(0), held)
    limited.steps.handle(command(limited, "q", "create", lora=LORA, seed=0), Rec(1), held)
    limited.steps.handle(command(limited, "p", "forward_backward", datums=BATCH), Rec(2), held)
    weights = _params(limited, pid)
    clock[0] += 800
    limited.steps.handle(command(limited, "p", "forward", datums=BATCH), Rec(3), held)  # a call
    clock[0] += 800  # 1,600 s since the forward_backward, 800 since the last call: kept
    limited.steps.handle(command(limited, "q", "forward", datums=BATCH), Rec(4), held)
    assert held.held == [(2, ("grads", pid))] and pid in limited.trainer._pinned
    clock[0] += 101  # 901 s idle: the next call, on any policy, drops them
    limited.steps.handle(command(limited, "q", "forward", datums=BATCH), Rec(5), held)
    assert held.held == [] and pid not in limited.trainer._pinned  # the commit moves on
    assert all(p.grad is None for p in limited.trainer.policy(pid).params)
    optim = command(limited, "p", "optim_step", adam=ADAM)
    out = limited.steps.handle(optim, Rec(6), held)
    assert out.event_type == "train.step.failed" and out.stage == "policy", out
    assert "expired after 901 s without a call (pinned_idle_s=900)" in out.reason
    assert "gradients of 1 forward_backward call(s)" in out.reason
    _same(_params(limited, pid), weights)
    limited.steps.handle(command(limited, "p", "forward_backward", datums=BATCH), Rec(7), held)
    step = limited.steps.handle(command(limited, "p", "optim_step", adam=ADAM), Rec(8), held)
    assert step.metrics["stepped"] == 1 and step.metrics["accumulated_calls"] == 1


# 4. Remembered answers.


def _answer(n: int) -> TrainStepCompleted:
    return TrainStepCompleted(request_id="r", op="forward", logprobs=[[-1.0] * n])


def test_remembered_answers_are_bounded_per_policy_overall_and_by_logprobs():
    kept = RememberedAnswers(per_policy=3, total=5, floats=100)
    for i in range(4):
        kept.put("t/a", f"a{i}", _answer(1))
    assert kept.get("t/a", "a0") is None and kept.get("t/a", "a3") is not None  # per policy
    for i in range(3):
        kept.put("t/b", f"b{i}", _answer(1))
    assert len(kept) == 5 and kept.get("t/a", "a1") is None  # overall, oldest first
    kept.put("t/c", "c0", _answer(98))  # 102 floats > 100: the oldest go until it fits
    assert kept.floats <= 100 and kept.get("t/c", "c0") is not None
    assert kept.floats == sum(len(r) for a in kept._all.values() for r in a[0].logprobs)
    kept.put("t/d", "d0", _answer(500))  # larger than the bound alone: the newest stays
    assert len(kept) == 1 and kept.floats == 500
    kept.drop("t/d")
    assert len(kept) == 0 and kept.floats == 0


def test_a_policys_answers_go_when_it_is_evicted(service):
    env_a, _ = call(service, "a", "create", lora=LORA, seed=0)
    env_b, _ = call(service, "b", "create", lora=LORA, seed=0)
    answers = service.steps._answers
    assert answers.get(f"{TENANT}/a", str(env_a.event_id)) is not None
    call(service, "c", "create", lora=LORA, seed=0)  # max_policies=2: a, least recent, goes
    assert f"{TENANT}/a" not in service.trainer.policies
    assert answers.get(f"{TENANT}/a", str(env_a.event_id)) is None
    assert answers.get(f"{TENANT}/b", str(env_b.event_id)) is not None
    # The evicted policy still answers a redelivered record from its checkpoint.
    again = service.steps.handle(env_a)
    assert again.event_type == "train.step.completed"


def test_answers_are_bounded_across_policies_in_the_service(service):
    service.steps._answers.total = 3
    call(service, "p", "create", lora=LORA, seed=0)
    for _ in range(4):
        call(service, "p", "forward", datums=BATCH)
    assert len(service.steps._answers) == 3


def test_an_export_carries_no_adapter_name_and_loads_in_stock_peft(service, tiny, tmp_path):
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    pid = f"{TENANT}/p"
    call(service, "p", "create", lora=LORA, seed=0)
    call(service, "p", "forward_backward", datums=BATCH)
    call(service, "p", "optim_step", adam=ADAM)
    out = service.trainer.write_adapter(pid, tmp_path / "export")
    keys = load_file(out / "adapter_model.safetensors")
    adapter = service.trainer.policy(pid).adapter
    assert keys and not any(adapter in k for k in keys)  # names are PEFT's default, stripped
    base = AutoModelForCausalLM.from_pretrained(tiny)
    loaded = PeftModel.from_pretrained(base, str(out))
    ids = torch.tensor([BATCH[0].tokens])
    with torch.no_grad():
        want = service.trainer.logits(pid, ids)
        got = loaded(input_ids=ids).logits
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)
