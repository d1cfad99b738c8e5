"""Step-level training calls (workers/trainer/steps.py) on the tiny Llama in-process: the
Tinker losses against hand-computed values, forward logprobs against the model's own, gradient
accumulation across calls, AdamW as torch computes it, failures answered, export reused. Kafka
and Cassandra are faked (a list of published events, a dict catalog); the model is real."""

from __future__ import annotations

import math

import pytest
import torch

from schemas.events import LoraSpec
from schemas.events.steps import AdamSpec, StepDatum, loss_config
from tests.unit.trainer._helpers import (
    ADAM,
    BATCH,
    LORA,
    TENANT,
    FakeDeferred,
    Rec,
    _grads,
    _params,
    answers,
    call,
    command,
    restarted,
)
from workers.trainer.losses import step_loss
from workers.trainer.step_compute import _token_batches
from workers.trainer.worker import derived_id

torch.set_num_threads(1)


# Losses: sums over positions, as Tinker's built-ins.


def _t(*values: float) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32)


def test_cross_entropy_is_the_weighted_sum_of_negative_logprobs():
    loss = step_loss("cross_entropy", _t(-1, -2, -3), {"weights": _t(0, 1, 0.5)}, {})
    assert float(loss) == pytest.approx(3.5)  # -(0·-1 + 1·-2 + 0.5·-3)


def test_importance_sampling_weighs_advantages_by_the_ratio():
    inputs = {"logprobs": _t(-1.5, -2), "advantages": _t(2, -1)}
    logp = _t(-1, -2).requires_grad_(True)
    loss = step_loss("importance_sampling", logp, inputs, {})
    assert float(loss.detach()) == pytest.approx(-(math.exp(0.5) * 2 - 1), rel=1e-6)
    loss.backward()  # d/dlogp = -ratio·A
    assert logp.grad.tolist() == pytest.approx([-math.exp(0.5) * 2, 1.0], rel=1e-6)


def test_ppo_clips_the_ratio_where_it_would_gain_by_leaving_the_range():
    inputs = {"logprobs": _t(0, 0, 0), "advantages": _t(1, -1, 2)}
    logp = torch.log(_t(1.5, 0.5, 1.1))
    cfg = loss_config("ppo", {})
    assert cfg == {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}
    # min(1.5, 1.2) + min(-0.5, -0.8) + min(2.2, 2.2) = 1.2 - 0.8 + 2.2
    assert float(step_loss("ppo", logp, inputs, cfg)) == pytest.approx(-2.6, rel=1e-6)
    wide = loss_config("ppo", {"clip_low_threshold": 0.5, "clip_high_threshold": 2.0})
    assert float(step_loss("ppo", logp, inputs, wide)) == pytest.approx(-3.2, rel=1e-6)


@pytest.mark.parametrize(
    ("loss_fn", "config", "says"),
    [
        ("ppo", {"clip_eps": 0.2}, "takes ['clip_high_threshold', 'clip_low_threshold']"),
        ("cross_entropy", {"clip_low_threshold": 0.5}, "takes nothing"),
        ("ppo", {"clip_low_threshold": 1.1}, "clip_low_threshold <= 1 <= clip_high_threshold"),
        ("dpo", {}, "use one of ['cispo', 'cross_entropy', 'dro', 'gspo', 'importance_sampling'"),
    ],
)
def test_a_loss_config_it_cannot_use_is_refused_naming_what_it_takes(loss_fn, config, says):
    with pytest.raises(ValueError, match=r".*") as e:
        loss_config(loss_fn, config)
    assert says in str(e.value)


def test_token_batches_keep_order_and_bound_padded_tokens():
    assert _token_batches([4, 4, 4, 10, 2], 12) == [[0, 1, 2], [3], [4]]
    assert _token_batches([30], 12) == [[0]]  # a longer row alone


# The service, on the tiny Llama.


def test_create_is_idempotent_and_refuses_another_shape(service):
    env, first = call(service, "p", "create", lora=LORA, seed=0)
    assert first.event_type == "train.step.completed"
    again_env, again = call(service, "p", "create", event_id=env.event_id, lora=LORA, seed=0)
    # redelivered: the remembered answer, re-sent as the same event (to this copy's request id)
    assert again == first.model_copy(update={"request_id": again_env.payload.request_id})
    sent = answers(service, env)
    assert len(sent) == 2 and {e.event_id for e in sent} == {derived_id(env.event_id, "step")}
    _, asked_again = call(service, "p", "create", lora=LORA, seed=0)
    assert asked_again.event_type == "train.step.completed"
    _, other = call(service, "p", "create", lora=LoraSpec(rank=8), seed=0)
    assert other.event_type == "train.step.failed" and other.stage == "validate"
    assert "already exists with rank=4" in other.reason


def test_forward_scores_each_target_after_its_prefix(service):
    call(service, "p", "create", lora=LORA, seed=0)
    _, out = call(service, "p", "forward", datums=BATCH)
    assert out.event_type == "train.step.completed", out
    pid = f"{TENANT}/p"
    expected, total = [], 0.0
    for d in BATCH:
        logits = service.trainer.logits(pid, torch.tensor([d.tokens]))[0]
        logp = torch.log_softmax(logits.float(), -1).gather(
            -1, torch.tensor(d.target_tokens)[:, None]
        )
        expected.append(logp.squeeze(-1).tolist())
        total += -(logp.squeeze(-1) * torch.tensor(d.weights)).sum().item()
    assert [len(x) for x in out.logprobs] == [5, 3]
    for got, want in zip(out.logprobs, expected, strict=True):
        assert got == pytest.approx(want, abs=1e-5)
    assert out.loss == pytest.approx(total, rel=1e-5)
    assert all(p.grad is None for p in service.trainer.policy(pid).params)  # no gradients


def test_gradients_accumulate_across_calls_until_optim_step(service):
    pid = f"{TENANT}/p"
    call(service, "p", "create", lora=LORA, seed=0)
    call(service, "p", "forward_backward", datums=BATCH)
    whole = _grads(service, pid)
    call(service, "p", "optim_step", adam=AdamSpec(learning_rate=1e-9))  # clears them
    assert all(p.grad is None for p in service.trainer.policy(pid).params)
    call(service, "p", "forward_backward", datums=BATCH[:1])
    _, second = call(service, "p", "forward_backward", datums=BATCH[1:])
    assert second.event_type == "train.step.completed"
    for a, b in zip(_grads(service, pid), whole, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)  # two calls = one call of both
    _, step = call(service, "p", "optim_step", adam=ADAM)
    assert step.metrics["accumulated_calls"] == 2 and step.metrics["grad_norm"] > 0


def test_optim_step_is_adamw_with_the_calls_hyperparameters(service):
    pid = f"{TENANT}/p"
    call(service, "p", "create", lora=LORA, seed=0)
    call(service, "p", "forward_backward", datums=BATCH)
    params = [p.detach().clone().requires_grad_(True) for p in service.trainer.policy(pid).params]
    for p, g in zip(params, _grads(service, pid), strict=True):
        p.grad = g
    adam = AdamSpec(
        learning_rate=0.05, beta1=0.8, beta2=0.9, eps=1e-6, weight_decay=0.1, grad_clip_norm=0.01
    )
    norm = torch.nn.utils.clip_grad_norm_(params, 0.01)
    torch.optim.AdamW(params, lr=0.05, betas=(0.8, 0.9), eps=1e-6, weight_decay=0.1).step()
    _, out = call(service, "p", "optim_step", adam=adam)
    assert out.metrics["grad_norm"] == pytest.approx(float(norm), rel=1e-5)
    for got, want in zip(service.trainer.policy(pid).params, params, strict=True):
        torch.testing.assert_close(got.detach(), want.detach(), atol=1e-6, rtol=1e-5)
    # The update path's own hyperparameters are back for its next step.
    group = service.trainer.policy(pid).backend.optimizer.param_groups[0]
    assert group["betas"] == (0.9, 0.999) and service.trainer.policy(pid).backend.clip == 1.0


def test_cross_entropy_falls_over_ten_steps(service):
    call(service, "p", "create", lora=LORA, seed=0)
    losses = []
    for _ in range(10):
        _, out = call(service, "p", "forward_backward", datums=BATCH)
        losses.append(out.loss)
        call(service, "p", "optim_step", adam=ADAM)
    assert losses[-1] < losses[0] * 0.9 and losses[-1] == min(losses), losses


def test_failures_are_answered_with_a_stage_and_a_reason(service):
    _, none = call(service, "ghost", "forward", datums=BATCH)
    assert (none.stage, none.retryable) == ("policy", False)
    assert "send op=create first" in none.reason
    call(service, "p", "create", lora=LORA, seed=0)
    bad = StepDatum(tokens=[1, 99999], target_tokens=[2, 3], weights=[1, 1])
    _, tokens = call(service, "p", "forward_backward", datums=[bad])
    assert tokens.stage == "validate" and "datums[0].tokens has token id 99999" in tokens.reason
    _, base = call(service, "p", "forward", base_model="other/base", datums=BATCH)
    assert base.stage == "validate" and "this trainer holds" in base.reason
    ppo = StepDatum(tokens=[1, 2], target_tokens=[2, 3], logprobs=[0, 0], advantages=[1, 1])
    _, cfg = call(
        service, "p", "forward", datums=[ppo], loss_fn="ppo", loss_fn_config={"clip": 0.2}
    )
    assert cfg.stage == "validate" and "does not take" in cfg.reason
    _, lora = call(service, "q", "create", lora=LoraSpec(target_modules=["no_such_proj"]))
    assert lora.stage == "validate" and "no_such_proj" in lora.reason


def test_a_failed_forward_backward_leaves_the_accumulated_gradients_as_they_were(service):
    pid = f"{TENANT}/p"
    call(service, "p", "create", lora=LORA, seed=0)
    call(service, "p", "forward_backward", datums=BATCH)
    before = _grads(service, pid)
    # (Inputs are finite, the schema says; a sampler logprob far below the policy's is not.)
    inf = StepDatum(tokens=[1, 2], target_tokens=[2, 3], logprobs=[-1e4, 0], advantages=[1, 1])
    # A good datum first (its backward runs), then one whose loss is Inf: the call fails whole.
    ok = StepDatum(tokens=[1, 2], target_tokens=[2, 3], logprobs=[0, 0], advantages=[1, 1])
    import workers.trainer.step_compute as sc

    old, sc.STEP_BATCH_TOKENS = sc.STEP_BATCH_TOKENS, 2  # one datum per forward
    try:
        _, out = call(
            service, "p", "forward_backward", datums=[ok, inf], loss_fn="importance_sampling"
        )
    finally:
        sc.STEP_BATCH_TOKENS = old
    assert out.stage == "compute" and "loss is -inf" in out.reason
    assert "ratio overflow: in datums[1]" in out.reason
    for a, b in zip(_grads(service, pid), before, strict=True):
        torch.testing.assert_close(a, b)


def test_policies_keep_their_gradients_while_others_train(service):
    a, b = f"{TENANT}/a", f"{TENANT}/b"
    call(service, "a", "create", lora=LORA, seed=0)
    call(service, "b", "create", lora=LORA, seed=1)
    call(service, "a", "forward_backward", datums=BATCH)
    kept = _grads(service, a)
    call(service, "b", "forward_backward", datums=BATCH[:1])
    call(service, "b", "optim_step", adam=ADAM)
    # An update request's step on b (the other path) clears b's gradients only.
    from workers.trainer.data import parse_examples

    trainer = service.trainer

    batch = trainer.collate(parse_examples([{"prompt": "x", "completion": " y"}], "sft"))
    trainer.sft_step(b, batch, 1e-3)
    for x, y in zip(_grads(service, a), kept, strict=True):
        torch.testing.assert_close(x, y)
    # With max_policies=2, a third policy evicts b (no gradients waiting), never a.
    call(service, "c", "create", lora=LORA, seed=2)
    assert a in trainer.policies and b not in trainer.policies
    # b comes back with its weights and optimizer state when it is called again.
    _, out = call(service, "b", "forward", datums=BATCH)
    assert out.event_type == "train.step.completed" and b in trainer.policies


def test_save_for_sampler_exports_registers_and_announces(service):
    call(service, "p", "create", lora=LORA, seed=0)
    call(service, "p", "forward_backward", datums=BATCH)
    call(service, "p", "optim_step", adam=ADAM)
    env, out = call(service, "p", "save_for_sampler", name="first")
    assert out.event_type == "train.step.completed" and out.revision == 1
    sent = answers(service, env)
    assert [e.type for e in sent] == ["export.completed", "train.step.completed"]
    export = sent[0].payload
    assert export.revision == 1 and export.parent_revision is None and export.rank == 4
    assert service.store.open(export.store_uri).digest == export.adapter_digest
    call(service, "p", "forward_backward", datums=BATCH)
    call(service, "p", "optim_step", adam=ADAM)
    env2, out2 = call(service, "p", "save_for_sampler", name="second")
    assert out2.revision == 2 and answers(service, env2)[0].payload.parent_revision == 1


# Restarts and rebalances: checkpoints, held offsets, replay.


def test_a_restart_between_forward_backward_and_optim_step_replays_the_held_records(service):
    pid = f"{TENANT}/p"
    log = [
        command(service, "p", "create", lora=LORA, seed=0),
        command(service, "p", "forward_backward", datums=BATCH[:1]),
        command(service, "p", "forward_backward", datums=BATCH[1:]),
        command(service, "p", "optim_step", adam=ADAM),
    ]
    held = FakeDeferred()
    for offset, env in enumerate(log[:3]):
        service.steps.handle(env, Rec(offset), held)
    assert held.held == [(1, ("grads", pid)), (2, ("grads", pid))]  # uncommitted: replayed
    grads = _grads(service, pid)
    # The trainer dies here; the consumer group redelivers from offset 1 (the oldest held).
    again, held2 = restarted(service), FakeDeferred()
    try:
        assert again.steps.handle(log[0], Rec(0), held2).event_type == "train.step.completed"
        first = again.steps.handle(log[1], Rec(1), held2)
        assert first.logprobs == service.steps._answers.get(pid, str(log[1].event_id)).logprobs
        again.steps.handle(log[2], Rec(2), held2)
        for a, b in zip(_grads(again, pid), grads, strict=True):
            torch.testing.assert_close(a, b)  # accumulated once, as before the restart
        step = again.steps.handle(log[3], Rec(3), held2)
        assert step.metrics["accumulated_calls"] == 2 and held2.held == []  # released
        service.steps.handle(log[3], Rec(3), held)  # the run that never died, for reference
        for a, b in zip(_params(again, pid), _params(service, pid), strict=True):
            torch.testing.assert_close(a, b)
    finally:
        again.trainer.close()


def test_a_restart_after_optim_step_resends_its_answer_and_steps_nothing_twice(service):
    pid = f"{TENANT}/p"
    log = [
        command(service, "p", "create", lora=LORA, seed=0),
        command(service, "p", "forward_backward", datums=BATCH),
        command(service, "p", "optim_step", adam=ADAM),
    ]
    answers_before = [
        service.steps.handle(env, Rec(i), FakeDeferred()) for i, env in enumerate(log)
    ]
    weights = _params(service, pid)
    # Died after the checkpoint, before the commit: all three are delivered again.
    again = restarted(service)
    try:
        replies = [again.steps.handle(env, Rec(i), FakeDeferred()) for i, env in enumerate(log)]
        assert replies[:2] == [None, None]  # done and answered before the checkpoint
        assert replies[2].metrics == answers_before[2].metrics  # the checkpoint's own answer
        assert again.trainer.policy(pid).steps == 1
        for a, b in zip(_params(again, pid), weights, strict=True):
            torch.testing.assert_close(a, b)
    finally:
        again.trainer.close()


def test_save_state_and_load_state_bring_back_weights_and_optimizer(service):
    pid = f"{TENANT}/p"
    call(service, "p", "create", lora=LORA, seed=0)
    call(service, "p", "forward_backward", datums=BATCH)
    call(service, "p", "optim_step", adam=ADAM)
    _, saved = call(service, "p", "save_state", name="after-1")
    assert saved.event_type == "train.step.completed" and saved.state_uri.endswith("after-1")
    weights = _params(service, pid)
    call(service, "p", "forward_backward", datums=BATCH)
    _, next_step = call(service, "p", "optim_step", adam=ADAM)
    _, loaded = call(service, "p", "load_state", source_uri=saved.state_uri)
    assert loaded.event_type == "train.step.completed", loaded
    for a, b in zip(_params(service, pid), weights, strict=True):
        torch.testing.assert_close(a, b)
    # The optimizer came back too: the same step again gives the same update.
    call(service, "p", "forward_backward", datums=BATCH)
    _, again = call(service, "p", "optim_step", adam=ADAM)
    assert again.metrics["grad_norm"] == pytest.approx(next_step.metrics["grad_norm"], rel=1e-5)


def test_load_state_refuses_what_is_not_a_saved_state_of_the_policy(service, tmp_path):
    call(service, "p", "create", lora=LORA, seed=0)
    # (Another policy's folder the envelope refuses already: payload URIs name their policy.)
    outside = (tmp_path / "elsewhere" / TENANT / "p" / "s").as_uri()
    _, other = call(service, "p", "load_state", source_uri=outside)
    assert other.stage == "validate" and "outside this store's root" in other.reason
    empty = (service.store.root / TENANT / "p" / "nothing").as_uri()
    _, none = call(service, "p", "load_state", source_uri=empty)
    assert none.stage == "validate" and "pass the state_uri that save_state answered" in none.reason


def test_a_revoked_partition_drops_its_policies_which_resume_from_their_checkpoint(service):
    from kafka import TopicPartition

    pid = f"{TENANT}/p"
    held = FakeDeferred()
    service.steps.handle(command(service, "p", "create", lora=LORA, seed=0), Rec(0), held)
    service.steps.handle(command(service, "p", "forward_backward", datums=BATCH), Rec(1), held)
    weights = _params(service, pid)
    service.steps.revoked({TopicPartition("t.train.steps", 1)})  # another partition: kept
    assert pid in service.trainer.policies
    service.steps.revoked({TopicPartition("t.train.steps", 0)})
    assert pid not in service.trainer.policies and pid not in service.trainer._pinned
    _, out = call(service, "p", "forward", datums=BATCH)
    assert out.event_type == "train.step.completed"
    for a, b in zip(_params(service, pid), weights, strict=True):
        torch.testing.assert_close(a, b)


def test_a_checkpoint_outage_is_waited_out_without_stepping_twice(service, monkeypatch):
    from catalog.exceptions import StoreUnavailable
    from workers.trainer import step_state

    pid, held = f"{TENANT}/p", FakeDeferred()
    service.steps.handle(command(service, "p", "create", lora=LORA, seed=0), Rec(0), held)
    service.steps.handle(command(service, "p", "forward_backward", datums=BATCH), Rec(1), held)
    optim = command(service, "p", "optim_step", adam=ADAM)
    real = step_state.checkpoint

    def away(*args):
        raise StoreUnavailable("the store is not reachable")

    monkeypatch.setattr(step_state, "checkpoint", away)
    with pytest.raises(StoreUnavailable):  # the consumer loop waits it out and calls again
        service.steps.handle(optim, Rec(2), held)
    assert held.held == [(1, ("grads", pid))]
    monkeypatch.setattr(step_state, "checkpoint", real)
    out = service.steps.handle(optim, Rec(2), held)
    assert out.metrics["stepped"] == 1 and service.trainer.policy(pid).steps == 1
    assert held.held == []


def test_a_refused_checkpoint_keeps_the_answer_and_the_held_records(service, monkeypatch):
    from workers.trainer import step_state

    pid, held = f"{TENANT}/p", FakeDeferred()
    service.steps.handle(command(service, "p", "create", lora=LORA, seed=0), Rec(0), held)
    service.steps.handle(command(service, "p", "forward_backward", datums=BATCH), Rec(1), held)

    def full(*args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(step_state, "checkpoint", full)
    out = service.steps.handle(command(service, "p", "optim_step", adam=ADAM), Rec(2), held)
    assert out.event_type == "train.step.completed" and out.metrics["stepped"] == 1
    assert held.held == [(1, ("grads", pid))]  # a restart replays onto the last checkpoint


def test_a_forward_backward_delivered_again_adds_its_gradients_once(service):
    pid = f"{TENANT}/p"
    call(service, "p", "create", lora=LORA, seed=0)
    env = command(service, "p", "forward_backward", datums=BATCH)
    first = service.steps.handle(env)
    grads = _grads(service, pid)
    service.steps._answers.clear()  # its answer no longer remembered
    again = service.steps.handle(env)
    flat = [x for row in first.logprobs for x in row]
    assert [x for row in again.logprobs for x in row] == pytest.approx(flat, abs=1e-6)
    assert again.loss == pytest.approx(first.loss)
    for a, b in zip(_grads(service, pid), grads, strict=True):
        torch.testing.assert_close(a, b)
    _, step = call(service, "p", "optim_step", adam=ADAM)
    assert step.metrics["accumulated_calls"] == 1


def test_a_call_sent_again_under_another_request_id_steps_once_and_answers_it(service):
    # The gateway re-sends a call (the SDK's retry, on any instance) under the first copy's
    # event id but, when the first never reached its future, under a new request id.
    pid = f"{TENANT}/p"
    call(service, "p", "create", lora=LORA, seed=0)
    call(service, "p", "forward_backward", datums=BATCH)
    env, first = call(service, "p", "optim_step", adam=ADAM)
    weights = _params(service, pid)
    copy = env.model_copy(
        update={"payload": env.payload.model_copy(update={"request_id": "optim_step-copy"})}
    )
    again = service.steps.handle(copy)
    assert again.request_id == "optim_step-copy" and again.metrics == first.metrics
    for a, b in zip(_params(service, pid), weights, strict=True):
        torch.testing.assert_close(a, b)  # not stepped twice
    assert answers(service, env)[-1].payload.request_id == "optim_step-copy"
