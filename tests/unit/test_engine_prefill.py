"""Which prompts the engine prefills before a batch (to fill vLLM's prefix cache), and the chat
rendering's error; vLLM itself is faked (the e2e serving tests run the real one)."""

from __future__ import annotations

from pathlib import Path

import pytest

from workers.serving.engine import EngineConfig, GenRequest, LoraHandle, VllmEngine
from workers.serving.exceptions import EngineError

pytestmark = pytest.mark.unit


class _FakeLLM:
    def __init__(self) -> None:
        self.calls: list[tuple[list, list]] = []

    def generate(self, prompts, params, lora_request=None, use_tqdm=False):
        self.calls.append((list(prompts), list(lora_request or [])))
        return []


def _engine() -> VllmEngine:
    engine = VllmEngine.__new__(VllmEngine)  # no vLLM: only the batch logic is under test
    engine.config = EngineConfig(model="m")
    engine.llm = _FakeLLM()
    return engine


def _lora(i: int) -> LoraHandle:
    return LoraHandle(i, f"a{i}", Path(f"/a{i}"))


def test_every_prompt_of_an_n_sample_request_and_one_chat_prompt_per_adapter_are_warmed():
    engine = _engine()
    reqs = [GenRequest("g1", n=8), GenRequest("g2", n=8, lora=_lora(1)),
            GenRequest("c1", chat=True, lora=_lora(1)), GenRequest("c2", chat=True, lora=_lora(1)),
            GenRequest("c3", chat=True, lora=_lora(2)),  # alone for its adapter: nothing shared
            GenRequest("raw1", lora=_lora(3)), GenRequest("raw2", lora=_lora(3))]  # fmt: skip
    prompts = [r.prompt for r in reqs]
    engine._prefill_once(prompts, reqs, [r.lora for r in reqs])
    ((warmed, loras),) = engine.llm.calls
    assert warmed == ["g1", "g2", "c1"]
    assert [x.lora_id if x else None for x in loras] == [None, 1, 1]


def test_a_batch_without_shared_prefixes_costs_no_extra_call() -> None:
    engine = _engine()
    reqs = [GenRequest("one", chat=True), GenRequest("two", lora=_lora(1))]
    engine._prefill_once([r.prompt for r in reqs], reqs, [r.lora for r in reqs])
    assert engine.llm.calls == []


def test_chat_on_a_model_without_a_template_names_the_fix() -> None:
    class NoTemplate:
        def apply_chat_template(self, *a, **k):
            raise ValueError("Cannot use chat template functions because tokenizer.chat_template "
                             "is not set")  # fmt: skip

    engine = _engine()
    engine.tokenizer = NoTemplate()
    assert engine.render(GenRequest("raw text")) == "raw text"
    with pytest.raises(EngineError, match="no usable chat template.*send chat=false"):
        engine.render(GenRequest("hi", chat=True))
