"""Losses on token log-probabilities: SFT cross-entropy and GRPO policy gradients.

All losses average over the completion tokens of the batch (token mean, as in DAPO/Tinker), so
long and short completions weigh by their tokens.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from schemas.events.steps import LOSS_CONFIG


def token_logprobs(logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """log π(token_t | tokens_<t) for t = 1…T-1, shape (B, T-1), in fp32."""
    logp = F.log_softmax(logits[:, :-1].float(), dim=-1)
    return logp.gather(-1, input_ids[:, 1:, None]).squeeze(-1)


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (values * mask).sum() / mask.sum().clamp(min=1)


def sft_loss(logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of the completion tokens (``mask`` is 1 where a token is learned)."""
    return -masked_mean(logprobs, mask)


def group_advantages(
    rewards: torch.Tensor, groups: torch.Tensor, normalize_std: bool = True, eps: float = 1e-6
) -> torch.Tensor:
    """GRPO advantages: each reward minus its group's mean (over its group's std if asked).

    A group is the samples drawn for one prompt; a group whose rewards are all equal carries no
    signal and gets zero advantages.
    """
    adv = torch.zeros_like(rewards, dtype=torch.float32)
    for g in torch.unique(groups):
        sel = groups == g
        r = rewards[sel].float()
        centered = r - r.mean()
        if normalize_std and r.numel() > 1:
            centered = centered / (r.std(unbiased=False) + eps)
        adv[sel] = centered
    return adv


def policy_gradient_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    kind: str = "ppo_clip",
    clip_eps: float = 0.2,
) -> tuple[torch.Tensor, dict[str, float]]:
    """GRPO surrogate loss per token, with ratio = exp(logπ - logπ_rollout).

    ``importance_sampling``: -ratio·A (the off-policy REINFORCE estimator: its gradient is
    ratio·A·∇logπ). ``ppo_clip``: -min(ratio·A, clip(ratio, 1±ε)·A).
    """
    ratio = torch.exp(logprobs - old_logprobs)
    adv = advantages[:, None].expand_as(logprobs)
    if kind == "importance_sampling":
        per_token = -ratio * adv
    elif kind == "ppo_clip":
        clipped = torch.clamp(ratio, 1.0 - clip_eps, 1.0 + clip_eps)
        per_token = -torch.minimum(ratio * adv, clipped * adv)
    else:
        raise ValueError(f"loss kind={kind!r}; expected 'importance_sampling' or 'ppo_clip'")
    with torch.no_grad():
        clip_frac = masked_mean(((ratio - 1).abs() > clip_eps).float(), mask)
        metrics = {
            "ratio_mean": float(masked_mean(ratio, mask)),
            "clip_fraction": float(clip_frac),
            "kl_rollout": float(masked_mean(old_logprobs - logprobs, mask)),
        }
    return masked_mean(per_token, mask), metrics


# Step-level losses (the Tinker API's built-ins, workers/trainer/steps.py): one datum's
# per-position log-probs of its target tokens against per-position inputs; SUMS over positions,
# as Tinker's are (the caller weights positions, e.g. 1/N in ``weights``, for a mean). Each is
# the formula and code Thinking Machines document (tinker-docs.thinkingmachines.ai/tinker/losses,
# tinker-cookbook docs/losses.mdx); keys and defaults: schemas.events.steps.LOSS_CONFIG.
# stable_reinforce is not here: its objective is not published (gateway/tinker/steps.py says so).


def gspo_ratio(logprobs: torch.Tensor, sampler: torch.Tensor, mask: torch.Tensor | None):
    """GSPO-token's per-position ratio: every position carries the sequence ratio's value,
    exp(mean of log π − log q over the positions ``mask`` marks, all if None), with its own
    log-probability's gradient. A mask that marks nothing: the ratio's value is 1."""
    marked = (mask != 0) if mask is not None else torch.ones_like(logprobs, dtype=torch.bool)
    diffs = (logprobs.detach() - sampler)[marked]
    log_ratio = diffs.mean() if diffs.numel() else diffs.new_zeros(())
    return torch.exp(log_ratio + logprobs - logprobs.detach())


def step_loss(
    loss_fn: str, logprobs: torch.Tensor, inputs: dict[str, torch.Tensor], config: dict[str, float]
) -> torch.Tensor:
    """One datum's loss. ``inputs``: ``weights`` (cross_entropy), or ``logprobs`` (the
    sampler's) and ``advantages`` (the others), and ``sequence_ratio_mask`` (gspo, optional);
    all shaped like ``logprobs``."""
    if loss_fn == "cross_entropy":
        return -(logprobs * inputs["weights"]).sum()
    if loss_fn not in LOSS_CONFIG:
        raise ValueError(f"loss_fn={loss_fn!r} is not a built-in loss")
    sampler, adv = inputs["logprobs"], inputs["advantages"]
    if loss_fn == "dro":  # log π·A − ½β(log π − log q)²
        penalty = 0.5 * config["beta"] * (logprobs - sampler) ** 2
        return -(logprobs * adv - penalty).sum()
    if loss_fn == "gspo":
        ratio = gspo_ratio(logprobs, sampler, inputs.get("sequence_ratio_mask"))
    else:
        ratio = torch.exp(logprobs - sampler)
    if loss_fn == "importance_sampling":
        return -(ratio * adv).sum()
    clipped = torch.clamp(ratio, config["clip_low_threshold"], config["clip_high_threshold"])
    if loss_fn == "cispo":  # sg(clip(ratio))·log π·A
        return -(clipped.detach() * logprobs * adv).sum()
    return -torch.minimum(ratio * adv, clipped * adv).sum()  # ppo, gspo
