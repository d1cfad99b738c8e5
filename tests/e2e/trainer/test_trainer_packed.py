"""A trained Qwen3-MoE adapter is stored with its packed file; the trainer resumes a parent from
the packed file exactly as stock PEFT loads the PEFT file."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import torch
from peft import PeftModel

from catalog.artifacts import PACKED_FILE
from catalog.packed import read_peft_weights
from catalog.store import AdapterStore
from workers.trainer import LoraShape, MultiPolicyTrainer, SftExample, TrainerConfig

EXPERTS = ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]
EXAMPLES = [
    SftExample(prompt=f"the {w} model", completion=f" {w} adapter")
    for w in ("red", "green", "blue", "fast")
]


def lora_params(trainer: MultiPolicyTrainer, policy: str) -> dict[str, torch.Tensor]:
    name = trainer.policy(policy).adapter
    return {
        n.replace(f".{name}.", "."): p.detach().clone()
        for n, p in trainer.model.named_parameters()
        if f".{name}." in n
    }


def test_moe_parent_loads_from_packed_file_like_stock_peft(
    tiny_models, tmp_path: Path, monkeypatch
):
    trainer = MultiPolicyTrainer(
        TrainerConfig(base_model=str(tiny_models["qwen3-moe"])),
        store=AdapterStore(tmp_path / "store"),
    )
    lora = LoraShape(4, 8.0, 0.0, ["q_proj", "o_proj"], EXPERTS)
    trainer.add_policy("acme/moe", lora, seed=0)
    batch = trainer.collate(EXAMPLES)
    trainer.sft_step("acme/moe", batch, lr=1e-2)
    stored = trainer.export("acme/moe", "acme", "moe")
    assert stored.manifest.layout == "packed-moe" and (stored.path / PACKED_FILE).is_file()
    trained = lora_params(trainer, "acme/moe")

    # From the packed file: stock PEFT's load_adapter is not used on this path.
    def no_peft_file(*_a, **_k):
        raise AssertionError("the PEFT file was read although a packed file is present")

    with monkeypatch.context() as m:
        m.setattr(PeftModel, "load_adapter", no_peft_file)
        trainer.add_policy("acme/from-packed", parent=stored, parent_revision=1)
        # ...also as the first adapter of a fresh trainer (no PeftModel yet).
        m.setattr(PeftModel, "from_pretrained", no_peft_file)
        fresh = MultiPolicyTrainer(TrainerConfig(base_model=str(tiny_models["qwen3-moe"])))
        fresh.add_policy("acme/fresh", parent=stored, parent_revision=1)
    got = lora_params(fresh, "acme/fresh")
    assert sorted(got) == sorted(trained) and all(torch.equal(got[n], trained[n]) for n in got)
    fresh.close()
    # Stock PEFT on the same revision without its packed file.
    plain = tmp_path / "plain"
    shutil.copytree(stored.path, plain)
    (plain / PACKED_FILE).unlink()
    assert read_peft_weights(plain) is None
    trainer.add_policy("acme/from-peft", parent=replace(stored, path=plain), parent_revision=1)

    packed, stock = lora_params(trainer, "acme/from-packed"), lora_params(trainer, "acme/from-peft")
    assert sorted(packed) == sorted(stock) == sorted(trained)
    assert any(".experts." in n for n in packed)
    for n in trained:
        assert torch.equal(packed[n], trained[n]) and torch.equal(stock[n], trained[n]), n
    torch.testing.assert_close(
        trainer.logits("acme/from-packed", batch.input_ids, batch.attention_mask),
        trainer.logits("acme/moe", batch.input_ids, batch.attention_mask),
        rtol=0,
        atol=0,
    )
    # It trains on from there exactly like the stock-loaded copy.
    a = trainer.sft_step("acme/from-packed", batch, lr=1e-2)
    b = trainer.sft_step("acme/from-peft", batch, lr=1e-2)
    assert a.loss == b.loss
    packed, stock = lora_params(trainer, "acme/from-packed"), lora_params(trainer, "acme/from-peft")
    assert all(torch.equal(packed[n], stock[n]) for n in packed)
    assert any(not torch.equal(packed[n], trained[n]) for n in packed if ".experts." in n)
