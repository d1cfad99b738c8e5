"""GRPO advantages and surrogate losses on hand-computed numbers (no model)."""

from __future__ import annotations

import math

import pytest
import torch

from workers.trainer.losses import group_advantages, policy_gradient_loss, sft_loss


def test_group_relative_advantages() -> None:
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0, 5.0, 5.0])
    groups = torch.tensor([0, 0, 0, 0, 1, 1])
    adv = group_advantages(rewards, groups)
    assert adv[:4].tolist() == pytest.approx([1.0, -1.0, 1.0, -1.0], abs=1e-4)
    assert adv[4:].tolist() == [0.0, 0.0]  # equal rewards: no signal
    raw = group_advantages(rewards, groups, normalize_std=False)
    assert raw[:4].tolist() == pytest.approx([0.5, -0.5, 0.5, -0.5])


def test_ppo_clip_and_importance_sampling() -> None:
    old = torch.zeros(2, 1)
    new = torch.tensor([[math.log(1.5)], [math.log(0.5)]])  # ratios 1.5 and 0.5
    mask = torch.ones(2, 1)
    adv = torch.tensor([1.0, -1.0])
    is_loss, _ = policy_gradient_loss(new, old, adv, mask, "importance_sampling")
    assert float(is_loss) == pytest.approx(-(1.5 * 1 + 0.5 * -1) / 2)
    clip_loss, m = policy_gradient_loss(new, old, adv, mask, "ppo_clip", clip_eps=0.2)
    # min(1.5·1, 1.2·1) = 1.2 and min(0.5·-1, 0.8·-1) = -0.8
    assert float(clip_loss) == pytest.approx(-(1.2 - 0.8) / 2)
    assert m["clip_fraction"] == 1.0
    with pytest.raises(ValueError, match="expected 'importance_sampling' or 'ppo_clip'"):
        policy_gradient_loss(new, old, adv, mask, "dpo")


def test_sft_loss_is_masked_token_mean() -> None:
    logprobs = torch.tensor([[-1.0, -2.0, -3.0]])
    mask = torch.tensor([[0.0, 1.0, 1.0]])
    assert float(sft_loss(logprobs, mask)) == pytest.approx(2.5)


def test_rollout_worker_rows_parse_and_collate(tiny_llama) -> None:
    from transformers import AutoTokenizer

    from workers.trainer.data import collate, parse_examples

    tok = AutoTokenizer.from_pretrained(str(tiny_llama))
    # The row shape workers.serving.rollout writes (vLLM token ids and sampled-token logprobs).
    rows = [
        {
            "prompt_index": i // 2,
            "sample": i % 2,
            "prompt": "hi",
            "prompt_token_ids": [1, 40],
            "completion": "",
            "token_ids": [5, 6, 7][: 2 + i % 2],
            "logprobs": [-1.0, -2.0, -3.0][: 2 + i % 2],
            "finish_reason": "length",
            "reward": i,
        }
        for i in range(4)
    ]
    batch = collate(tok, parse_examples(rows, "rl"), max_len=64, add_eos=False)
    assert batch.groups.tolist() == [0, 0, 1, 1]
    assert batch.input_ids[1].tolist() == [1, 40, 5, 6, 7]
    assert batch.loss_mask[1].tolist() == [0.0, 1.0, 1.0, 1.0]
    assert batch.old_logprobs[1].tolist() == [0.0, -1.0, -2.0, -3.0]
    assert batch.loss_mask[0].tolist() == [0.0, 1.0, 1.0, 0.0]  # shorter row is padded out
