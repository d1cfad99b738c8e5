"""LoRA on DeepSeek-V3.2 (DSA: MLA + a lightning indexer's top-k sparse attention, and MoE).

The adapter targets the MLA projections and the fused experts, as on DeepSeek-V3. The indexer's
own projections are not targets: their LoRA gets no gradient from the LM loss (last test). The
tiny model keeps ``index_topk=4`` and every sequence here is longer, so the sparse path runs;
each test checks that it did (``_Sparse``).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import AutoModelForCausalLM
from transformers.models.deepseek_v32.modeling_deepseek_v32 import DeepseekV32Indexer

from catalog.store import AdapterStore
from workers.trainer import LoraShape, MultiPolicyTrainer, SftExample, TrainerConfig
from workers.trainer.data import Rollout
from workers.trainer.prefix import plain_logprobs, shared_prefix_logprobs

ARCH = "deepseek-v32"
MLA = ["q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj"]
EXPERTS = ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]
INDEXER = ["indexer.wq_b", "indexer.wk", "indexer.weights_proj"]
DSA = LoraShape(4, 8.0, 0.0, MLA, EXPERTS)
EXAMPLES = [
    SftExample(
        prompt=f"question: which colour is the {w} ball? answer:",
        completion=f" the {w} one, said the model",
    )
    for w in ("red", "green", "blue", "fast")
]
PROMPTS = ["question: count from one to five. answer:", "the quick brown fox jumps over"]


class _Sparse:
    """Forward hooks on every indexer: the widest key range a query chose its top-k from."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.indexers = [m for m in model.modules() if isinstance(m, DeepseekV32Indexer)]
        assert self.indexers, "the model has DSA indexers"
        self.topk = {m.index_topk for m in self.indexers}
        self.calls = 0
        self.max_keys = 0
        self.widths: set[int] = set()

    def _hook(self, module, args, out) -> None:
        # args[3] is the [B, S, T] mask the indexer scores against; out is [B, S, topk].
        self.calls += 1
        self.max_keys = max(self.max_keys, args[3].shape[-1])
        self.widths.add(out.shape[-1])

    def __enter__(self) -> _Sparse:
        self.handles = [m.register_forward_hook(self._hook) for m in self.indexers]
        return self

    def __exit__(self, *exc) -> None:
        for h in self.handles:
            h.remove()

    def assert_sparse(self) -> None:
        (topk,) = self.topk
        assert self.calls, "the indexer ran"
        assert self.max_keys > topk, f"a query had {self.max_keys} keys to choose {topk} from"
        assert self.widths == {topk}, self.widths


def _dense_logits(model: torch.nn.Module, batch) -> torch.Tensor:
    """The same forward with every indexer keeping all keys (top-k ≥ sequence length)."""
    indexers = [m for m in model.modules() if isinstance(m, DeepseekV32Indexer)]
    kept = [m.index_topk for m in indexers]
    try:
        for m in indexers:
            m.index_topk = batch.input_ids.shape[1]
        with torch.no_grad():
            return model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    finally:
        for m, k in zip(indexers, kept, strict=True):
            m.index_topk = k


def _lora_weights(trainer: MultiPolicyTrainer, adapter: str) -> dict[str, torch.Tensor]:
    return {
        n: p.detach().clone() for n, p in trainer.model.named_parameters() if f".{adapter}." in n
    }


def _changed(before: dict[str, torch.Tensor], trainer: MultiPolicyTrainer) -> set[str]:
    now = dict(trainer.model.named_parameters())
    return {n for n, p in before.items() if not torch.equal(p, now[n])}


def test_dsa_sft_trains_and_exports_for_stock_peft(tiny_models, tmp_path: Path) -> None:
    base_path = tiny_models[ARCH]
    trainer = MultiPolicyTrainer(
        TrainerConfig(base_model=str(base_path)), store=AdapterStore(tmp_path / "store")
    )
    state = trainer.add_policy("acme/dsa", DSA, seed=0)
    before = _lora_weights(trainer, state.adapter)

    batch = trainer.collate(EXAMPLES)
    with _Sparse(trainer.model) as sparse:
        first = trainer.sft_step("acme/dsa", batch, lr=1e-2)
        second = trainer.sft_step("acme/dsa", batch, lr=1e-2)
    sparse.assert_sparse()
    assert second.loss < first.loss
    changed = _changed(before, trainer)
    assert any(".experts." in n for n in changed), "the expert LoRA weights were updated"
    for proj in MLA:
        assert any(f".{proj}." in n for n in changed), proj
    assert not any(".indexer." in n for n in before), "the indexer carries no LoRA"

    stored = trainer.export("acme/dsa", "acme", ARCH)
    assert stored.manifest.target_modules == sorted(MLA)
    assert stored.manifest.target_parameters == sorted(EXPERTS)
    base = AutoModelForCausalLM.from_pretrained(str(base_path), dtype=torch.float32)
    peft_model = PeftModel.from_pretrained(base, str(stored.path)).eval()
    with torch.no_grad(), _Sparse(peft_model) as sparse:
        expected = peft_model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    sparse.assert_sparse()
    mine = trainer.logits("acme/dsa", batch.input_ids, batch.attention_mask)
    torch.testing.assert_close(mine, expected, atol=1e-5, rtol=0)
    # The top-k mask matters: keeping every key gives other logits.
    dense = _dense_logits(peft_model, batch)
    assert (dense - expected).abs().max() > 1e-3


def test_dsa_grpo_step_moves_the_policy(tiny_models) -> None:
    trainer = MultiPolicyTrainer(TrainerConfig(base_model=str(tiny_models[ARCH])))
    state = trainer.add_policy("acme/rl", DSA, seed=0)
    before = _lora_weights(trainer, state.adapter)
    with _Sparse(trainer.model) as sparse:  # decoding with the indexer's key cache
        rows = trainer.sample("acme/rl", PROMPTS, n=4, max_new_tokens=6, seed=0)
    sparse.assert_sparse()
    rollouts = [Rollout(**r, reward=sum(t % 2 == 0 for t in r["completion_ids"]) / 6) for r in rows]
    batch = trainer.collate(rollouts, add_eos=False)
    assert batch.rewards.std() > 0

    # GRPO rows share prompts: the step runs each prompt once and gathers its KV and indexer-key
    # cache to the rows. Under DSA that equals the plain forward too.
    with torch.no_grad(), _Sparse(trainer.model) as sparse:
        trainer.activate("acme/rl")
        args = (batch.input_ids, batch.attention_mask, batch.loss_mask)
        plain = plain_logprobs(trainer.model, *args)
        shared = shared_prefix_logprobs(trainer.model, *args)
    sparse.assert_sparse()
    mask = batch.loss_mask.bool()
    torch.testing.assert_close(shared[mask], plain[mask], atol=2e-5, rtol=1e-4)

    with _Sparse(trainer.model) as sparse:
        first = trainer.rl_step("acme/rl", batch, lr=1e-2)
        second = trainer.rl_step("acme/rl", batch, lr=1e-2)
    sparse.assert_sparse()
    # Sampling (cached decode) and training (full forward) select the same keys: ratio 1.
    assert first.metrics["ratio_mean"] == pytest.approx(1.0, abs=1e-4)
    assert second.loss < first.loss  # the surrogate improves on the same rollouts
    assert second.metrics["ratio_mean"] != pytest.approx(1.0, abs=1e-4)
    changed = _changed(before, trainer)
    for proj in MLA:
        assert any(f".{proj}." in n for n in changed), proj
    assert any(".experts." in n for n in changed)


def test_indexer_lora_gets_no_gradient_from_the_lm_loss(tiny_models, monkeypatch) -> None:
    """Why the indexer is not a LoRA target: the LM loss reaches attention only through the
    top-k *indices* (an integer scatter into a boolean mask), so nothing flows back into the
    indexer's projections, whether or not its forward runs under ``torch.no_grad`` (it does in
    transformers 5). DeepSeek trains the indexer with a separate KL loss against the dense
    attention distribution; the trainer has no such objective."""
    base = AutoModelForCausalLM.from_pretrained(str(tiny_models[ARCH]), dtype=torch.float32)
    # init_lora_weights=False: B ≠ 0, so every LoRA has a path to the output if one exists.
    model = get_peft_model(
        base, LoraConfig(r=4, lora_alpha=8, target_modules=MLA + INDEXER, init_lora_weights=False)
    )
    model.train()
    ids = torch.randint(5, 2000, (2, 24), generator=torch.Generator().manual_seed(0))
    forward = DeepseekV32Indexer.forward
    for unwrapped in (False, True):
        if unwrapped:  # the bare function, as if the indexer ran with autograd on
            monkeypatch.setattr(DeepseekV32Indexer, "forward", forward.__wrapped__)
        model.zero_grad(set_to_none=True)
        with _Sparse(model) as sparse:
            model(input_ids=ids).logits.float().logsumexp(-1).mean().backward()
        sparse.assert_sparse()
        grads = {n: p.grad for n, p in model.named_parameters() if ".lora_" in n}
        for proj in MLA:
            assert all(
                g is not None and g.abs().sum() > 0
                for n, g in grads.items()
                if f".{proj}.lora_" in n
            ), proj
        indexer = {n: g for n, g in grads.items() if ".indexer." in n}
        assert len(indexer) == 2 * 2 * len(INDEXER)  # layers × (A, B) × projections
        assert all(g is None for g in indexer.values()), (unwrapped, indexer)


@pytest.mark.parametrize("targets", [MLA + INDEXER, ["wk"], ["weights_proj", "o_proj"]])
def test_a_policy_naming_indexer_targets_is_refused(tiny_models, targets) -> None:
    from workers.trainer.exceptions import UntrainableTarget

    trainer = MultiPolicyTrainer(TrainerConfig(base_model=str(tiny_models[ARCH])))
    try:
        with pytest.raises(UntrainableTarget, match=r"indexer.*no gradient"):
            trainer.add_policy("p", LoraShape(4, 8.0, 0.0, targets, []))
        assert trainer.add_policy("q", DSA).lora == DSA  # the MLA targets still train
    finally:
        trainer.close()
