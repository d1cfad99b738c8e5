"""LoRA on MoE experts (fused 3-D parameters, via PEFT target_parameters) and on MLA projections."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM

from catalog.store import AdapterStore
from workers.trainer import LoraShape, MultiPolicyTrainer, SftExample, TrainerConfig

EXPERTS = ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]
CASES = {
    "qwen3-moe": LoraShape(4, 8.0, 0.0, ["q_proj", "k_proj", "v_proj", "o_proj"], EXPERTS),
    # MLA: the low-rank query/key-value projections and the output projection.
    "deepseek-v3": LoraShape(
        4, 8.0, 0.0, ["q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj"], EXPERTS
    ),
}
EXAMPLES = [
    SftExample(prompt=f"the {w} model", completion=f" {w} adapter")
    for w in ("red", "green", "blue", "fast")
]


@pytest.mark.parametrize("arch", sorted(CASES))
def test_moe_lora_trains_and_exports_for_stock_peft(tiny_models, arch: str, tmp_path: Path):
    base_path = tiny_models[arch]
    trainer = MultiPolicyTrainer(
        TrainerConfig(base_model=str(base_path)), store=AdapterStore(tmp_path / "store")
    )
    state = trainer.add_policy("acme/moe", CASES[arch], seed=0)
    trainer.add_policy("acme/other", CASES[arch], seed=1)  # a second policy on the same base
    trained = {n for n, _ in trainer.model.named_parameters() if f".{state.adapter}." in n}
    assert any(".experts." in n for n in trained), "expert parameters carry LoRA"
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if n in trained}

    batch = trainer.collate(EXAMPLES)
    first = trainer.sft_step("acme/moe", batch, lr=1e-2)
    second = trainer.sft_step("acme/moe", batch, lr=1e-2)
    assert second.loss < first.loss
    changed = {
        n
        for n, p in trainer.model.named_parameters()
        if n in trained and not torch.equal(before[n], p)
    }
    assert any(".experts." in n for n in changed), "the expert LoRA weights were updated"
    for proj in CASES[arch].target_modules:
        assert any(f".{proj}." in n for n in changed), proj

    stored = trainer.export("acme/moe", "acme", arch)
    assert stored.manifest.target_parameters == sorted(EXPERTS)
    base = AutoModelForCausalLM.from_pretrained(str(base_path), dtype=torch.float32)
    peft_model = PeftModel.from_pretrained(base, str(stored.path)).eval()
    with torch.no_grad():
        expected = peft_model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    mine = trainer.logits("acme/moe", batch.input_ids, batch.attention_mask)
    torch.testing.assert_close(mine, expected, atol=1e-5, rtol=0)
