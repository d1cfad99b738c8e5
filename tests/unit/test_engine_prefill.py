"""Which prompts the engine prefills before a batch (to fill vLLM's prefix cache), the chat
rendering's error, and what the engine admits into a batch (vLLM serve's rules on the context and
sampling values); vLLM itself is faked (the e2e serving tests run the real one)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from workers.serving.admission import admit
from workers.serving.engine import EngineConfig, GenRequest, LoraHandle, VllmEngine
from workers.serving.exceptions import EngineError, RequestRefused

pytestmark = pytest.mark.unit


class _FakeLLM:
    def __init__(self) -> None:
        self.calls: list[tuple[list, list]] = []

    def generate(self, prompts, params, lora_request=None, use_tqdm=False):
        self.calls.append((list(prompts), list(lora_request or [])))
        return []


class _WordTokenizer:
    """A word is a token, plus a BOS; the chat template wraps each turn in two more words."""

    def encode(self, text: str) -> list[int]:
        return list(range(len(text.split()) + 1))

    def apply_chat_template(self, turns, tokenize=False, add_generation_prompt=True):
        return " ".join(f"<{t['role']}> {t['content']} </s>" for t in turns) + " <assistant>"


def _engine() -> VllmEngine:
    engine = VllmEngine.__new__(VllmEngine)  # no vLLM: only the batch logic is under test
    engine.config = EngineConfig(model="m", max_model_len=32)
    engine.llm = _FakeLLM()
    engine.tokenizer = _WordTokenizer()
    engine._lock = threading.Lock()
    return engine


def _lora(i: int) -> LoraHandle:
    return LoraHandle(i, f"a{i}", Path(f"/a{i}"))


def test_every_prompt_of_an_n_sample_request_and_one_chat_prompt_per_adapter_are_warmed():
    engine = _engine()
    reqs = [
        GenRequest("g1", n=8),
        GenRequest("g2", n=8, lora=_lora(1)),
        GenRequest("c1", chat=True, lora=_lora(1)),
        GenRequest("c2", chat=True, lora=_lora(1)),
        GenRequest("c3", chat=True, lora=_lora(2)),  # alone for its adapter: nothing shared
        GenRequest("raw1", lora=_lora(3)),
        GenRequest("raw2", lora=_lora(3)),
    ]
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
            raise ValueError(
                "Cannot use chat template functions because tokenizer.chat_template is not set"
            )

    engine = _engine()
    engine.tokenizer = NoTemplate()
    assert engine.render(GenRequest("raw text")) == "raw text"
    with pytest.raises(EngineError, match="no usable chat template.*send chat=false"):
        engine.render(GenRequest("hi", chat=True))


@pytest.mark.parametrize(
    ("request_", "prompt_tokens", "code", "match"),
    [
        (GenRequest("x", temperature=5.0), 2, "invalid_value", r"temperature=5.0 .* 0 and 2"),
        (GenRequest("x", temperature=float("nan")), 2, "invalid_value", "temperature=nan"),
        (GenRequest("x", top_p=0.0), 2, "invalid_value", r"top_p=0.0 .*\(0, 1\]"),
        (GenRequest("x", seed=2**64), 2, "invalid_value", "seed=.* 64 bits"),
        (
            GenRequest("x", max_tokens=100),
            2,
            "invalid_value",
            r"max_tokens=100 .* context of 32 tokens .* at most 30",
        ),
        (GenRequest("x", max_tokens=4), 0, "invalid_value", "empty after tokenization"),
        (
            GenRequest("x", max_tokens=4),
            40,
            "context_length_exceeded",
            r"maximum context length is 32 tokens, but the prompt has 40 tokens .* at most 28",
        ),
        (GenRequest("x", max_tokens=4), 32, "context_length_exceeded", "no room for a completion"),
    ],
)
def test_admission_refuses_what_vllm_cannot_run_with_the_numbers(
    request_, prompt_tokens, code, match
) -> None:
    with pytest.raises(RequestRefused, match=match) as refused:
        admit(request_, prompt_tokens=prompt_tokens, max_model_len=32)
    assert refused.value.code == code


def test_admission_clamps_max_tokens_to_the_context_left_as_vllm_serve() -> None:
    assert (
        admit(GenRequest("x", max_tokens=30), prompt_tokens=20, max_model_len=32).max_tokens == 12
    )
    kept = GenRequest("x", max_tokens=8)
    assert admit(kept, prompt_tokens=20, max_model_len=32) is kept
    # the largest prompt that still gets one token
    assert admit(GenRequest("x", max_tokens=8), prompt_tokens=31, max_model_len=32).max_tokens == 1


def test_the_engine_counts_the_chat_template_and_runs_the_ids_it_counted() -> None:
    engine = _engine()
    plain = engine.admit(GenRequest("one two three", max_tokens=4))
    assert plain.prompt == [0, 1, 2, 3] and plain.max_tokens == 4
    # 12 words of content are 12 + 3 (template) + 1 (BOS) = 16 tokens as a chat turn: 16 left
    chat = engine.admit(GenRequest(" ".join(["w"] * 12), max_tokens=20, chat=True))
    assert len(chat.prompt) == 16 and chat.max_tokens == 16
    with pytest.raises(RequestRefused, match="34 tokens") as refused:
        engine.admit(
            GenRequest("hi", chat=True, messages=({"role": "user", "content": "w " * 30},))
        )
    assert refused.value.code == "context_length_exceeded"


def test_a_chat_request_to_a_model_without_a_template_is_refused_not_failed() -> None:
    engine = _engine()
    engine.tokenizer.apply_chat_template = lambda *a, **k: (_ for _ in ()).throw(
        ValueError("tokenizer.chat_template is not set")
    )
    with pytest.raises(RequestRefused, match="send chat=false") as refused:
        engine.admit(GenRequest("hi", chat=True))
    assert refused.value.code == "invalid_value"


def test_generate_turns_a_sampling_value_vllm_refuses_into_an_engine_error() -> None:
    # SamplingParams was built outside generate's try: its ValueError left the serving loop and
    # the process exited (issue 25, 1).
    with pytest.raises(EngineError, match="temperature"):
        _engine().generate([GenRequest("hi", temperature=5.0)])
