"""Which prompts the engine prefills before a batch (to fill vLLM's prefix cache), how a
request's text is handed on while it is generated (DeltaStream), the chat
rendering's error, and what the engine admits into a batch (vLLM serve's rules on the context and
sampling values); vLLM itself is faked (the e2e serving tests run the real one)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace

import pytest

from workers.serving import generation
from workers.serving.admission import admit
from workers.serving.engine import EngineConfig, GenRequest, LoraHandle, VllmEngine
from workers.serving.exceptions import EngineError, RequestRefused
from workers.serving.generation import DeltaStream, shared_prefixes

pytestmark = pytest.mark.unit


class _WordTokenizer:
    """A word is a token, plus a BOS; the chat template wraps each turn in two more words."""

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(range(len(text.split()) + int(add_special_tokens)))

    def apply_chat_template(self, turns, tokenize=False, add_generation_prompt=True):
        return " ".join(f"<{t['role']}> {t['content']} </s>" for t in turns) + " <assistant>"


def _engine() -> VllmEngine:
    engine = VllmEngine.__new__(VllmEngine)  # no vLLM: only the batch logic is under test
    engine.config = EngineConfig(model="m", max_model_len=32)
    engine.tokenizer = _WordTokenizer()
    return engine


def _lora(i: int) -> LoraHandle:
    return LoraHandle(i, f"a{i}", Path(f"/a{i}"))


def test_one_chat_prompt_per_adapter_with_several_is_prefilled_first():
    reqs = [
        GenRequest("g1", n=8),  # warms its own prompt
        GenRequest("c1", chat=True, lora=_lora(1)),
        GenRequest("c2", chat=True, lora=_lora(1)),
        GenRequest("c3", chat=True, lora=_lora(2)),  # alone for its adapter: nothing shared
        GenRequest("raw1", lora=_lora(3)),
        GenRequest("raw2", lora=_lora(3)),
    ]
    assert [r.prompt for r in shared_prefixes(reqs)] == ["c1"]
    assert shared_prefixes([GenRequest("one", chat=True), GenRequest("two", lora=_lora(1))]) == []


class _Out:
    """A vLLM RequestOutput in DELTA mode: the new text and tokens of some choices."""

    def __init__(self, *choices, prompt=(1, 2)) -> None:
        self.prompt_token_ids = list(prompt)
        self.outputs = [
            SimpleNamespace(
                index=i,
                text=t,
                token_ids=list(ids),
                logprobs=None,
                finish_reason=f,
                stop_reason=None,
            )
            for i, t, ids, f in choices
        ]


def test_a_stream_passes_the_first_text_at_once_then_batches_and_assembles_every_choice(
    monkeypatch,
) -> None:
    now = [100.0]
    monkeypatch.setattr(generation.time, "monotonic", lambda: now[0])
    sent: list[tuple[int, str, int]] = []
    stream = DeltaStream(2, lambda i, text, n: sent.append((i, text, n)))
    stream.add(_Out((0, "He", [1], None), (1, "Yo", [2], None)))  # first text: at once
    now[0] += 0.01
    stream.add(_Out((0, "llo", [3], None)))  # 10 ms later: held
    now[0] += 0.05
    stream.add(_Out((0, " you", [4], None)))  # 60 ms after the last: due
    stream.add(_Out((0, "", [5], "stop"), (1, "!", [6], "length")))  # finished: flushed
    # (choice 0's last token added no text: nothing to send for it)
    assert sent == [(0, "He", 1), (1, "Yo", 1), (0, "llo you", 2), (1, "!", 1)]
    res = stream.result()
    assert [s.text for s in res.samples] == ["Hello you", "Yo!"]
    assert [s.token_ids for s in res.samples] == [[1, 3, 4, 5], [2, 6]]
    assert [s.finish_reason for s in res.samples] == ["stop", "length"]
    assert res.prompt_token_ids == [1, 2]


def test_a_stream_passes_text_every_sixteen_tokens_however_fast_they_come(monkeypatch) -> None:
    monkeypatch.setattr(generation.time, "monotonic", lambda: 5.0)  # no time passes
    sent: list[int] = []
    stream = DeltaStream(1, lambda i, text, n: sent.append(n))
    for k in range(40):
        stream.add(_Out((0, f"t{k}", [k], None)))
    assert sent == [1, 16, 16]  # the first at once, then every 16 tokens; 7 still held
    stream.add(_Out((0, ".", [40], "stop")))
    assert sent[-1] == 8 and sum(sent) == 41


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
            r"max_tokens=100 cannot be greater than max_model_len=32\. .* at most 30",
        ),
        (GenRequest("x", max_tokens=4), 0, "invalid_value", "empty after tokenization"),
        (
            GenRequest("x", max_tokens=4),
            40,
            "context_length_exceeded",
            r"maximum context length is 32 tokens\. However, your prompt contains at least 33 "
            r"input tokens.* \(The prompt has 40 tokens.* at most 28",
        ),
        (
            GenRequest("x", max_tokens=4),
            32,
            "context_length_exceeded",
            r"max_tokens must be at least 1, got 0\. .*no room for a completion",
        ),
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
    # 12 words of content are 12 + 3 (template) = 15 tokens as a chat turn (no BOS on top of the
    # template's own, as vllm serve): 17 left
    chat = engine.admit(GenRequest(" ".join(["w"] * 12), max_tokens=20, chat=True))
    assert len(chat.prompt) == 15 and chat.max_tokens == 17
    with pytest.raises(RequestRefused, match="33 tokens") as refused:
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


def test_a_sampling_value_vllm_refuses_is_the_requests_own_refusal() -> None:
    # SamplingParams was built outside generate's try: its ValueError left the serving loop and
    # the process exited (issue 25, 1). Now it ends that request alone, with vLLM's words.
    with pytest.raises(RequestRefused, match="temperature"):
        asyncio.run(_engine()._run(GenRequest("hi", temperature=5.0), "r-1", None))
