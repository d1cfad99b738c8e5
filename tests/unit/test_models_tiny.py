"""Tiny model specs: sizes within limits, shapes vLLM's LoRA kernels accept, tokenizer round-trips."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from workers.models import ARCHS, SIZES, TinySpec, tiny_config, train_tokenizer
from workers.models.exceptions import ModelBuildError
from workers.models.tiny import PARAM_LIMITS


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("arch", ARCHS)
def test_parameter_counts_and_shapes(arch: str, size: str) -> None:
    config = tiny_config(TinySpec(arch, size))
    with torch.device("meta"):  # no memory, no init: just count
        model = AutoModelForCausalLM.from_config(config)
    n = sum(p.numel() for p in model.parameters())
    assert n <= PARAM_LIMITS[size]
    if size == "small":
        assert 0.35e9 <= n <= 0.6e9, n
    assert config.hidden_size % 64 == 0
    assert config.vocab_size <= 32000
    assert config.tie_word_embeddings is False


@pytest.mark.parametrize(
    ("arch", "size", "match"),
    [("gpt2", "test", "arch='gpt2' is unknown"), ("llama", "huge", "size='huge' is unknown")],
)
def test_unknown_spec_is_refused(arch: str, size: str, match: str) -> None:
    with pytest.raises(ModelBuildError, match=match):
        TinySpec(arch, size)


def test_tokenizer_is_deterministic_and_round_trips() -> None:
    a = train_tokenizer(512, seed=3, corpus_lines=500)
    b = train_tokenizer(512, seed=3, corpus_lines=500)
    text = "question: 12 plus 30 equals? answer: 42 — ünïcode ✓"
    ids = a(text).input_ids
    assert ids == b(text).input_ids
    assert ids[0] == a.bos_token_id
    assert a.decode(ids, skip_special_tokens=True) == text
    assert len(a) <= 512


@pytest.mark.parametrize("size", SIZES)
def test_dsa_indexer_keeps_fewer_keys_than_test_sequences(size: str) -> None:
    config = tiny_config(TinySpec("deepseek-v32", size))
    assert config.model_type == "deepseek_v32"
    # The indexer splits its head into a rotary and a plain part, and reads q_a_proj's output.
    assert config.index_head_dim > config.qk_rope_head_dim and config.q_lora_rank
    if size == "test":  # the trainer's tests use sequences of 10+ tokens: top-k must be sparse
        assert config.index_topk <= 8
        assert config.index_n_heads >= 16  # few heads: exact-zero scores, ties (see tiny.py)
