"""A small byte-level BPE tokenizer trained locally with `tokenizers` (no model hub).

Byte-level, so every string round-trips; saved as a transformers fast tokenizer
(`tokenizer.json` + `tokenizer_config.json`) that both transformers and vLLM load.
"""

from __future__ import annotations

import random
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

BOS = "<|bos|>"
EOS = "<|eos|>"
PAD = "<|pad|>"
SPECIAL_TOKENS = [PAD, BOS, EOS]  # ids 0, 1, 2 in this order

_WORDS = [
    "the",
    "a",
    "an",
    "of",
    "to",
    "and",
    "in",
    "is",
    "it",
    "that",
    "for",
    "on",
    "with",
    "as",
    "by",
    "at",
    "from",
    "this",
    "be",
    "are",
    "was",
    "or",
    "not",
    "but",
    "model",
    "policy",
    "adapter",
    "revision",
    "alias",
    "base",
    "train",
    "serve",
    "rollout",
    "reward",
    "update",
    "export",
    "load",
    "token",
    "tokens",
    "learn",
    "rate",
    "step",
    "loss",
    "gradient",
    "batch",
    "group",
    "advantage",
    "ratio",
    "clip",
    "value",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "zero",
    "plus",
    "minus",
    "equals",
    "answer",
    "question",
    "hello",
    "world",
    "yes",
    "no",
    "true",
    "false",
    "good",
    "bad",
    "small",
    "large",
    "fast",
    "slow",
    "red",
    "green",
    "blue",
    "cat",
    "dog",
    "math",
    "code",
    "text",
    "data",
    "kafka",
    "cassandra",
    "vllm",
    "torch",
    "lora",
    "rank",
    "alpha",
    "expert",
    "attention",
    "layer",
]


def _corpus(seed: int, lines: int) -> list[str]:
    """Deterministic synthetic text: words, numbers and arithmetic, enough for BPE merges."""
    rng = random.Random(seed)
    out = []
    for _ in range(lines):
        kind = rng.random()
        if kind < 0.5:
            out.append(" ".join(rng.choice(_WORDS) for _ in range(rng.randint(4, 16))) + ".")
        elif kind < 0.8:
            a, b = rng.randint(0, 999), rng.randint(0, 999)
            out.append(f"question: {a} plus {b} equals? answer: {a + b}")
        else:
            out.append(" ".join(str(rng.randint(0, 10 ** rng.randint(1, 6))) for _ in range(8)))
    return out


def train_tokenizer(
    vocab_size: int, seed: int = 0, corpus_lines: int = 4000
) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE of at most ``vocab_size`` tokens (fewer if the corpus runs out)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(seed, corpus_lines), trainer=trainer)
    # Prepend BOS like Llama tokenizers do, so prompts look like a real model's.
    bos_id = tok.token_to_id(BOS)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=PAD, model_max_length=4096
    )


def save_tokenizer(tokenizer: PreTrainedTokenizerFast, out: Path) -> None:
    tokenizer.save_pretrained(str(out))
