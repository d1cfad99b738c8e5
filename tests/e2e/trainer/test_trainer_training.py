"""LoRA SFT and GRPO on a resident tiny Llama: losses fall, rewards rise, exports load in PEFT."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from peft import PeftModel
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from catalog.exceptions import BaseModelMismatch, NonFiniteWeights
from catalog.store import AdapterStore
from workers.trainer import LoraShape, MultiPolicyTrainer, Rollout, SftExample, TrainerConfig
from workers.trainer.config import LossConfig

ALL_LINEAR = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
TOY_SFT = [
    SftExample(prompt=f"question: {i} plus {i + 1} equals? answer:", completion=f" {2 * i + 1}")
    for i in range(8)
]
PROMPTS = ["question: 1 plus 2", "hello world", "the model", "red green blue"]


def even_reward(completion_ids: list[int]) -> float:
    """Toy reward: the share of sampled token ids that are even (≈ 0.5 for the random base)."""
    return sum(1 for t in completion_ids if t % 2 == 0) / len(completion_ids)


def test_sft_loss_falls_over_20_steps(tiny_llama: Path) -> None:
    trainer = MultiPolicyTrainer(TrainerConfig(base_model=str(tiny_llama)))
    trainer.add_policy("acme/sft", LoraShape(rank=8, alpha=16, target_modules=ALL_LINEAR), seed=0)
    batch = trainer.collate(TOY_SFT)
    losses = [trainer.sft_step("acme/sft", batch, lr=1e-2).loss for _ in range(20)]
    assert losses[-1] < 0.8 * losses[0], losses
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5, losses


@pytest.mark.parametrize("rl_loss", ["ppo_clip", "importance_sampling"])
def test_grpo_raises_mean_reward_within_bounded_steps(tiny_llama: Path, rl_loss: str) -> None:
    config = TrainerConfig(base_model=str(tiny_llama), loss=LossConfig(rl_loss=rl_loss))
    trainer = MultiPolicyTrainer(config)
    lora = LoraShape(rank=8, alpha=16, target_modules=["q_proj", "v_proj", "lm_head"])
    trainer.add_policy("acme/rl", lora, seed=0)
    rewards, ratios = [], []
    for step in range(15):
        rows = trainer.sample("acme/rl", PROMPTS, n=8, max_new_tokens=8, seed=step)
        rollouts = [Rollout(**r, reward=even_reward(r["completion_ids"])) for r in rows]
        batch = trainer.collate(rollouts, add_eos=False)
        # Two optimizer steps per batch: the second is off-policy, so the ratio (and PPO's
        # clip) come into play against the rollout's logprobs.
        for _ in range(2):
            result = trainer.rl_step("acme/rl", batch, lr=1e-2)
            ratios.append(result.metrics["ratio_mean"])
        rewards.append(result.metrics["reward_mean"])
        if step >= 3 and sum(rewards[-3:]) / 3 > 0.8:
            break
    start = sum(rewards[:3]) / 3
    assert start < 0.65, rewards  # the random base really starts near 0.5
    assert sum(rewards[-3:]) / 3 > 0.8, rewards
    assert any(abs(r - 1.0) > 1e-4 for r in ratios)  # the off-policy ratio was exercised


def test_export_loads_in_stock_peft_with_identical_logits(tiny_llama: Path, tmp_path: Path):
    store = AdapterStore(tmp_path / "store")
    trainer = MultiPolicyTrainer(TrainerConfig(base_model=str(tiny_llama)), store=store)
    ptrs = trainer.base_parameter_ptrs()
    lora = LoraShape(rank=8, alpha=16, target_modules=ALL_LINEAR)
    trainer.add_policy("acme/a", lora, seed=0)
    trainer.add_policy("acme/b", LoraShape(rank=4, alpha=8), seed=1)
    batch = trainer.collate(TOY_SFT)
    for _ in range(3):
        trainer.sft_step("acme/a", batch, lr=1e-2)
        trainer.sft_step("acme/b", batch, lr=1e-2)
    assert trainer.base_parameter_ptrs() == ptrs  # one base, never copied

    stored = trainer.export("acme/a", "acme", "a", training={"objective": "sft"})
    assert stored.manifest.base_model_fingerprint == trainer.fingerprint
    assert stored.manifest.target_modules == sorted(ALL_LINEAR)

    base = AutoModelForCausalLM.from_pretrained(str(tiny_llama), dtype=torch.float32)
    peft_model = PeftModel.from_pretrained(base, str(stored.path)).eval()
    with torch.no_grad():
        expected = peft_model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
        with peft_model.disable_adapter():
            plain = peft_model(
                input_ids=batch.input_ids, attention_mask=batch.attention_mask
            ).logits
    mine = trainer.logits("acme/a", batch.input_ids, batch.attention_mask)
    torch.testing.assert_close(mine, expected, atol=1e-5, rtol=0)
    assert (mine - plain).abs().max() > 1e-3  # the adapter really changes the output
    other = trainer.logits("acme/b", batch.input_ids, batch.attention_mask)
    assert (other - mine).abs().max() > 1e-3  # policies stay apart on the shared base

    # A second export of unchanged weights is the same revision; one more step is a new one.
    assert trainer.export("acme/a", "acme", "a").digest == stored.digest
    trainer.sft_step("acme/a", batch, lr=1e-2)
    child = trainer.export("acme/a", "acme", "a")
    assert child.digest != stored.digest and child.manifest.parent_digest == stored.digest


def test_store_refuses_a_poisoned_export_and_a_foreign_base(tiny_models, tmp_path: Path):
    store = AdapterStore(tmp_path / "store")
    trainer = MultiPolicyTrainer(TrainerConfig(base_model=str(tiny_models["llama"])), store=store)
    trainer.add_policy("acme/a", seed=0)
    trainer.sft_step("acme/a", trainer.collate(TOY_SFT), lr=1e-2)
    out = trainer.write_adapter("acme/a", tmp_path / "export")
    weights = load_file(str(out / "adapter_model.safetensors"))
    key = sorted(weights)[0]
    weights[key][0, 0] = float("nan")
    save_file(weights, str(out / "adapter_model.safetensors"))
    with pytest.raises(NonFiniteWeights, match="NaN/Inf"):
        store.put(
            out,
            tenant="acme",
            policy="a",
            base_model="tiny",
            base_model_fingerprint=trainer.fingerprint,
        )
    stored = trainer.export("acme/a", "acme", "a")
    moe = MultiPolicyTrainer(TrainerConfig(base_model=str(tiny_models["qwen3-moe"])))
    with pytest.raises(BaseModelMismatch, match="this engine's base has fingerprint"):
        store.open(stored.uri, base_model_fingerprint=moe.fingerprint)


def test_resume_from_a_stored_revision(tiny_llama: Path, tmp_path: Path) -> None:
    store = AdapterStore(tmp_path / "store")
    first = MultiPolicyTrainer(TrainerConfig(base_model=str(tiny_llama)), store=store)
    first.add_policy("acme/a", seed=0)
    batch = first.collate(TOY_SFT)
    first.sft_step("acme/a", batch, lr=1e-2)
    stored = first.export("acme/a", "acme", "a")
    second = MultiPolicyTrainer(TrainerConfig(base_model=str(tiny_llama)), store=store)
    parent = store.open(stored.uri, base_model_fingerprint=second.fingerprint)
    second.add_policy("acme/a", parent=parent, parent_revision=1)
    torch.testing.assert_close(
        second.logits("acme/a", batch.input_ids),
        first.logits("acme/a", batch.input_ids),
        atol=1e-5,
        rtol=0,
    )
    loss = second.sft_step("acme/a", batch, lr=1e-2).loss
    assert loss == pytest.approx(first.sft_step("acme/a", batch, lr=1e-2).loss, abs=0.05)


def test_lm_head_lora_exports_lora_tensors_only(tiny_llama: Path, tmp_path: Path) -> None:
    trainer = MultiPolicyTrainer(
        TrainerConfig(base_model=str(tiny_llama)), store=AdapterStore(tmp_path / "store")
    )
    trainer.add_policy(
        "acme/rl", LoraShape(rank=8, alpha=16, target_modules=["q_proj", "lm_head"]), seed=0
    )
    batch = trainer.collate(TOY_SFT)
    trainer.sft_step("acme/rl", batch, lr=1e-2)
    stored = trainer.export("acme/rl", "acme", "rl")
    keys = load_file(str(stored.path / "adapter_model.safetensors")).keys()
    assert all(".lora_A." in k or ".lora_B." in k for k in keys)  # no base lm_head copy
    peft_model = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(str(tiny_llama)), str(stored.path)
    ).eval()
    with torch.no_grad():
        expected = peft_model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    mine = trainer.logits("acme/rl", batch.input_ids, batch.attention_mask)
    torch.testing.assert_close(mine, expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize("with_store", [True, False])
def test_evict_and_continue_gives_the_weights_of_no_eviction(
    tiny_llama: Path, tmp_path: Path, with_store: bool
) -> None:
    store = AdapterStore(tmp_path / "store") if with_store else None
    lora = LoraShape(rank=4, alpha=8, target_modules=["q_proj", "v_proj"])
    batch_rows = TOY_SFT[:4]

    def train(max_policies: int) -> list[torch.Tensor]:
        trainer = MultiPolicyTrainer(
            TrainerConfig(base_model=str(tiny_llama), max_policies=max_policies), store
        )
        batch = trainer.collate(batch_rows)
        trainer.add_policy("acme/a", lora, seed=0)
        for _ in range(2):  # unexported steps and optimizer state that no revision holds
            trainer.sft_step("acme/a", batch, lr=1e-2)
        trainer.add_policy("acme/b", lora, seed=1)  # with max_policies=1 this evicts acme/a
        trainer.sft_step("acme/b", batch, lr=1e-2)
        trainer.add_policy("acme/a", lora, seed=0)  # back, as the worker re-adds it
        trainer.sft_step("acme/a", batch, lr=1e-2)
        out = [p.detach().clone() for p in trainer.policy("acme/a").params]
        assert trainer.policy("acme/a").steps == 3
        trainer.close()
        return out

    resident, evicted = train(max_policies=2), train(max_policies=1)
    assert all(
        torch.allclose(a, b, atol=1e-6, rtol=0) for a, b in zip(resident, evicted, strict=True)
    )
    if store is not None:  # the saved state was consumed on return
        assert not (store.root / "acme" / "a" / "trainer-state").exists()
