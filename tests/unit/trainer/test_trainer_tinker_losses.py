"""Tinker's cispo, dro and gspo (workers/trainer/losses.py ``step_loss``) against the formulas
Thinking Machines document (tinker-docs.thinkingmachines.ai/tinker/losses), written out here in
torch, value and gradient, on random per-position inputs; their configs' keys, defaults and
refusals (schemas.events.steps.loss_config)."""

from __future__ import annotations

import math

import pytest
import torch

from schemas.events.steps import LOSS_CONFIG, loss_config
from workers.trainer.losses import step_loss

torch.set_num_threads(1)


def _inputs(seed: int, n: int = 9) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    target = -torch.rand(n, generator=g, dtype=torch.float64) * 3
    sampler = target + torch.randn(n, generator=g, dtype=torch.float64) * 0.4
    adv = torch.randn(n, generator=g, dtype=torch.float64)
    return target, {"logprobs": sampler, "advantages": adv}


# The docs' code for each loss, as written there (target_logprobs: the learner's).


def _cispo(target, sampling, advantages, low, high):
    prob_ratio = torch.exp(target - sampling)
    clipped_ratio = torch.clamp(prob_ratio, low, high)
    return -(clipped_ratio.detach() * target * advantages).sum()


def _dro(target, sampling, advantages, beta):
    quadratic_term = (target - sampling) ** 2
    return -(target * advantages - 0.5 * beta * quadratic_term).sum()


def _gspo(target, ref, advantages, mask, low, high):
    in_ratio = mask != 0
    log_ratio = (target.detach() - ref)[in_ratio].mean()
    ratio = torch.exp(log_ratio + target - target.detach())
    clipped = torch.clamp(ratio, low, high)
    return -torch.min(ratio * advantages, clipped * advantages).sum()


def _value_and_grad(fn, target):
    x = target.clone().requires_grad_(True)
    loss = fn(x)
    loss.backward()
    return float(loss.detach()), x.grad


def _same(mine, reference, target):
    got, got_grad = _value_and_grad(mine, target)
    want, want_grad = _value_and_grad(reference, target)
    assert got == pytest.approx(want, rel=1e-12, abs=1e-12)
    assert torch.allclose(got_grad, want_grad, rtol=1e-12, atol=1e-12), (got_grad, want_grad)
    return got_grad


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("given", [{}, {"clip_low_threshold": 0.95, "clip_high_threshold": 1.02}])
def test_cispo_is_the_detached_clipped_ratio_times_logprob_and_advantage(seed, given):
    target, inputs = _inputs(seed)
    cfg = loss_config("cispo", given)
    lo, hi = cfg["clip_low_threshold"], cfg["clip_high_threshold"]
    grad = _same(
        lambda x: step_loss("cispo", x, inputs, cfg),
        lambda x: _cispo(x, inputs["logprobs"], inputs["advantages"], lo, hi),
        target,
    )
    # the gradient is -sg(clip(ratio))·A: no position loses it, unlike ppo's clipped ones
    ratio = torch.exp(target - inputs["logprobs"]).clamp(lo, hi)
    assert torch.allclose(grad, -ratio * inputs["advantages"])


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("beta", [0.05, 0.0, 2.5])
def test_dro_is_logprob_times_advantage_less_a_quadratic_penalty(seed, beta):
    target, inputs = _inputs(seed)
    cfg = loss_config("dro", {} if beta == 0.05 else {"beta": beta})
    assert cfg == {"beta": beta}
    grad = _same(
        lambda x: step_loss("dro", x, inputs, cfg),
        lambda x: _dro(x, inputs["logprobs"], inputs["advantages"], beta),
        target,
    )
    assert torch.allclose(grad, -(inputs["advantages"] - beta * (target - inputs["logprobs"])))


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("given", [{}, {"clip_low_threshold": 0.999, "clip_high_threshold": 1.001}])
def test_gspo_token_carries_the_sequence_ratio_with_its_own_gradient(seed, given):
    target, inputs = _inputs(seed)
    g = torch.Generator().manual_seed(100 + seed)
    mask = (torch.rand(target.shape, generator=g) > 0.3).double()
    mask[0] = 1.0
    cfg = loss_config("gspo", given)
    lo, hi = cfg["clip_low_threshold"], cfg["clip_high_threshold"]
    with_mask = {**inputs, "sequence_ratio_mask": mask}
    _same(
        lambda x: step_loss("gspo", x, with_mask, cfg),
        lambda x: _gspo(x, inputs["logprobs"], inputs["advantages"], mask, lo, hi),
        target,
    )
    # no mask: every position is in the ratio
    _same(
        lambda x: step_loss("gspo", x, inputs, cfg),
        lambda x: _gspo(x, inputs["logprobs"], inputs["advantages"], mask * 0 + 1, lo, hi),
        target,
    )


def test_gspo_positions_share_one_ratio_and_an_empty_mask_means_ratio_one():
    target = torch.tensor([-1.0, -2.0, -0.5], dtype=torch.float64)
    sampler = torch.tensor([-1.2, -1.0, -0.5], dtype=torch.float64)
    adv = torch.tensor([1.0, 1.0, 1.0], dtype=torch.float64)
    wide = {"clip_low_threshold": 0.0, "clip_high_threshold": 100.0}
    mask = torch.tensor([1.0, 0.0, 1.0], dtype=torch.float64)
    loss = step_loss(
        "gspo", target, {"logprobs": sampler, "advantages": adv, "sequence_ratio_mask": mask}, wide
    )
    s = math.exp((0.2 + 0.0) / 2)  # the mean log-ratio over positions 0 and 2
    assert float(loss) == pytest.approx(-3 * s, rel=1e-9)
    empty = {"logprobs": sampler, "advantages": adv, "sequence_ratio_mask": mask * 0}
    assert float(step_loss("gspo", target, empty, wide)) == pytest.approx(-3.0)


def test_the_config_keys_and_defaults_are_the_documented_ones():
    assert LOSS_CONFIG["cispo"] == LOSS_CONFIG["gspo"] == LOSS_CONFIG["ppo"]
    assert LOSS_CONFIG["ppo"] == {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}
    assert loss_config("dro", {}) == {"beta": 0.05}
    assert "stable_reinforce" not in LOSS_CONFIG and "custom" not in LOSS_CONFIG


@pytest.mark.parametrize(
    ("loss_fn", "config", "says"),
    [
        ("cispo", {"beta": 0.1}, "takes ['clip_high_threshold', 'clip_low_threshold']"),
        ("dro", {"clip_low_threshold": 0.5}, "it takes ['beta']"),
        ("dro", {"beta": -0.1}, "loss_fn_config.beta is -0.1"),
        ("dro", {"beta": float("nan")}, "loss_fn_config.beta is nan"),
        ("gspo", {"clip_high_threshold": 0.9}, "loss_fn_config.clip_high_threshold"),
        ("cispo", {"clip_low_threshold": -0.5}, "loss_fn_config.clip_low_threshold"),
        ("ppo", {"clip_high_threshold": float("inf")}, "must be a finite number"),
        ("stable_reinforce", {}, "is not a built-in loss"),
    ],
)
def test_a_bad_config_value_is_refused_naming_the_field(loss_fn, config, says):
    with pytest.raises(ValueError) as e:
        loss_config(loss_fn, config)
    assert says in str(e.value)
