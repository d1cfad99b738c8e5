"""Shared-prefix log-probs (each distinct prompt run once) equal the plain forward, values and
gradients, on dense, MoE and MLA architectures."""

from __future__ import annotations

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM

from workers.trainer.data import Rollout, collate
from workers.trainer.prefix import plain_logprobs, shared_prefix_logprobs

TARGETS = {
    "llama": ["q_proj", "v_proj", "down_proj"],
    "qwen3-moe": ["q_proj", "o_proj"],
    "deepseek-v3": ["q_a_proj", "kv_b_proj", "o_proj"],
}


class _Tok:
    pad_token_id = 0


def _rows() -> list[Rollout]:
    """Two prompt lengths (two buckets), 3 samples each of ragged length, plus a lone prompt."""
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(5, 200, (n,), generator=g).tolist() for n in (7, 7, 9)]
    rows = []
    for gi, p in enumerate(prompts):
        for k in range(1 if gi == 2 else 3):
            comp = torch.randint(5, 200, (2 + 2 * k,), generator=g).tolist()
            rows.append(Rollout(prompt_ids=p, completion_ids=comp, reward=float(k), group=gi))
    return rows


@pytest.mark.parametrize("arch", sorted(TARGETS))
def test_shared_prefix_equals_plain_forward_and_gradient(tiny_models, arch: str) -> None:
    base = AutoModelForCausalLM.from_pretrained(tiny_models[arch], dtype=torch.float32)
    # init_lora_weights=False: B ≠ 0, so the LoRA changes the prompt's keys and values and a
    # gradient that skipped the prompt would differ.
    model = get_peft_model(
        base, LoraConfig(r=4, lora_alpha=8, target_modules=TARGETS[arch], init_lora_weights=False)
    )
    model.train()
    batch = collate(_Tok(), _rows(), max_len=64, add_eos=False)
    args = (batch.input_ids, batch.attention_mask, batch.loss_mask)
    grads = []
    for fn in (plain_logprobs, shared_prefix_logprobs):
        model.zero_grad()
        lp = fn(model, *args)
        (lp * batch.loss_mask).sum().backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad})
        if fn is plain_logprobs:
            want = lp.detach()
    got = lp.detach()
    mask = batch.loss_mask.bool()
    assert got.shape == want.shape
    torch.testing.assert_close(got[mask], want[mask], atol=2e-5, rtol=1e-4)
    assert grads[0].keys() == grads[1].keys() and grads[0]
    for name, g in grads[0].items():
        torch.testing.assert_close(grads[1][name], g, atol=1e-4, rtol=1e-3, msg=name)


def test_micro_batched_step_equals_one_whole_batch_step(tiny_llama) -> None:
    """Gradients of micro-batches (whole groups each) add up to the whole batch's: the same
    update, loss and metrics, with a smaller peak of activations."""
    from workers.trainer import LoraShape, MultiPolicyTrainer, TrainerConfig

    results = []
    for rows in (None, 3):  # 3 rows: the two 3-sample groups apart, the lone prompt alone
        tr = MultiPolicyTrainer(TrainerConfig(base_model=str(tiny_llama), micro_batch_rows=rows))
        tr.add_policy("p", LoraShape(4, 8.0, 0.0, ["q_proj", "v_proj"]), seed=0)
        batch = tr.collate(_rows(), add_eos=False)
        first = tr.rl_step("p", batch, 1e-2)
        second = tr.rl_step("p", batch, 1e-2)  # B ≠ 0 after the first: the prompt matters too
        weights = {n: p.detach().clone() for n, p in tr.model.named_parameters() if "lora_" in n}
        results.append((first, second, weights))
        tr.close()
    (f1, s1, w1), (f2, s2, w2) = results
    assert f1.loss == pytest.approx(f2.loss, abs=1e-6) and s1.loss == pytest.approx(
        s2.loss, abs=1e-5
    )
    assert s1.grad_norm == pytest.approx(s2.grad_norm, rel=1e-4)
    assert s1.metrics["ratio_mean"] == pytest.approx(s2.metrics["ratio_mean"], rel=1e-5)
    for name, w in w1.items():
        torch.testing.assert_close(w2[name], w, atol=1e-5, rtol=1e-4, msg=name)
