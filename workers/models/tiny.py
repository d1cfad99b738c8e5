"""Random-weight models of real transformers 5 architectures, in a `test` and a `small` size.

`test` (≤ 20M parameters, fp32) is for CPU tests: every dimension is a multiple of 32/64 and the
vocabulary is small, so vLLM's LoRA kernels and PEFT both accept it. `small` (≈ 0.5B, bf16) is
for benchmarks. The same seed gives the same weights and the same tokenizer, byte for byte.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import structlog
import torch
from transformers import (
    AutoModelForCausalLM,
    DeepseekV3Config,
    DeepseekV32Config,
    LlamaConfig,
    Qwen3MoeConfig,
)

from workers.models.exceptions import ModelBuildError
from workers.models.tokenizer import SPECIAL_TOKENS, save_tokenizer, train_tokenizer

log = structlog.get_logger()

Arch = Literal["llama", "qwen3-moe", "deepseek-v3", "deepseek-v32"]
Size = Literal["test", "small"]
ARCHS: tuple[str, ...] = ("llama", "qwen3-moe", "deepseek-v3", "deepseek-v32")
SIZES: tuple[str, ...] = ("test", "small")
PARAM_LIMITS = {"test": 20_000_000, "small": 700_000_000}

# The model's vocabulary is at least the tokenizer's; the BPE stops when the corpus runs out, so
# the tokenizer is trained to at most this many tokens and the embedding rows above it stay unused.
_TOKENIZER_VOCAB = {"test": 2048, "small": 8192}

# Each field: one value for both sizes, or (test, small).
_COMMON: dict[str, Any] = dict(
    vocab_size=(2048, 32000),
    hidden_size=(128, 1024),
    num_attention_heads=(4, 16),
    num_key_value_heads=(2, 16),
    head_dim=(32, 64),
    max_position_embeddings=(2048, 4096),
)
_MOE: dict[str, Any] = dict(  # the dimensions both MoE models share
    num_hidden_layers=(2, 16),
    intermediate_size=(256, 2816),
    moe_intermediate_size=(64, 512),
    num_experts_per_tok=(2, 4),
)
_ARCH: dict[str, dict[str, Any]] = {
    "llama": dict(num_hidden_layers=(2, 28), intermediate_size=(384, 3584)),
    "qwen3-moe": dict(_MOE, num_key_value_heads=(2, 4), num_experts=(4, 16), norm_topk_prob=True),
    "deepseek-v3": dict(
        _MOE,
        num_key_value_heads=(4, 16),
        n_routed_experts=(4, 16),
        n_shared_experts=1,
        n_group=1,
        topk_group=1,
        first_k_dense_replace=1,
        q_lora_rank=(64, 384),
        kv_lora_rank=(32, 256),
        qk_rope_head_dim=(16, 32),
        qk_nope_head_dim=(16, 64),
        v_head_dim=(16, 64),
    ),
}

# DeepSeek-V3.2: V3's MLA + MoE plus DSA, a lightning indexer per layer (its own projections
# `indexer.wq_b`, `indexer.wk`, `indexer.weights_proj`) that keeps the top `index_topk` keys per
# query. The test size keeps 4, so any test sequence past 4 tokens takes the sparse path. Its
# score is Σ_h w_h·relu(q_h·k): with 4 heads, random weights scored whole keys exactly 0 often
# enough that top-k broke ties differently in the plain and the cached forward (4 of 48 GRPO
# log-probs off by 0.13); 16 heads make an all-zero key rare.
_ARCH["deepseek-v32"] = dict(
    _ARCH["deepseek-v3"], index_topk=(4, 256), index_n_heads=16, index_head_dim=(32, 64)
)


def _sized(fields: dict[str, Any], size: str) -> dict[str, Any]:
    """``fields`` with each (test, small) pair resolved to ``size``'s value."""
    return {k: v[SIZES.index(size)] if isinstance(v, tuple) else v for k, v in fields.items()}


_CONFIG_CLASS = {
    "llama": LlamaConfig,
    "qwen3-moe": Qwen3MoeConfig,
    "deepseek-v3": DeepseekV3Config,
    "deepseek-v32": DeepseekV32Config,
}


@dataclass(frozen=True)
class TinySpec:
    arch: str
    size: str
    seed: int = 0

    def __post_init__(self) -> None:
        if self.arch not in ARCHS:
            raise ModelBuildError(f"arch={self.arch!r} is unknown; expected one of {ARCHS}")
        if self.size not in SIZES:
            raise ModelBuildError(f"size={self.size!r} is unknown; expected one of {SIZES}")


def tiny_dtype(spec: TinySpec) -> torch.dtype:
    # fp32 for tests (exact logit comparisons), bf16 for the benchmark size (half the RAM).
    return torch.float32 if spec.size == "test" else torch.bfloat16


def tiny_config(spec: TinySpec):
    """The transformers config of a tiny model (no weights)."""
    kwargs = _sized({**_COMMON, **_ARCH[spec.arch]}, spec.size)
    if spec.arch in ("deepseek-v3", "deepseek-v32"):
        kwargs.pop("head_dim")  # MLA derives head sizes from the qk/v dims
    return _CONFIG_CLASS[spec.arch](
        **kwargs,
        tie_word_embeddings=False,
        pad_token_id=SPECIAL_TOKENS.index("<|pad|>"),
        bos_token_id=SPECIAL_TOKENS.index("<|bos|>"),
        eos_token_id=SPECIAL_TOKENS.index("<|eos|>"),
        dtype=tiny_dtype(spec),
    )


def build_tiny(spec: TinySpec, out: Path, overwrite: bool = False) -> Path:
    """Write model weights (safetensors), config and tokenizer to ``out``; return ``out``.

    Written into a temporary sibling folder and renamed, so a crash never leaves half a model.
    """
    out = Path(out)
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise ModelBuildError(
            f"out={str(out)!r} exists and is not empty; pass overwrite=True (--overwrite) "
            "or choose another folder"
        )
    config = tiny_config(spec)
    torch.manual_seed(spec.seed)
    model = AutoModelForCausalLM.from_config(config, dtype=tiny_dtype(spec))
    n_params = sum(p.numel() for p in model.parameters())
    if n_params > PARAM_LIMITS[spec.size]:
        raise ModelBuildError(
            f"{spec.arch}/{spec.size} has {n_params:,} parameters, over the {spec.size} limit of "
            f"{PARAM_LIMITS[spec.size]:,}; shrink its entry in workers/models/tiny.py"
        )
    tokenizer = train_tokenizer(_TOKENIZER_VOCAB[spec.size], seed=spec.seed)
    if len(tokenizer) > config.vocab_size:
        raise ModelBuildError(
            f"tokenizer has {len(tokenizer)} tokens but vocab_size={config.vocab_size}"
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        model.save_pretrained(str(tmp), safe_serialization=True)
        model.generation_config.save_pretrained(str(tmp))
        save_tokenizer(tokenizer, tmp)
        info = {"arch": spec.arch, "size": spec.size, "seed": spec.seed, "parameters": n_params}
        (tmp / "mint_tiny.json").write_text(json.dumps(info, indent=2) + "\n")
        if out.exists():
            shutil.rmtree(out)
        tmp.chmod(0o755)  # mkdtemp makes 0700; the folder is shared with serving processes
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log.info("tiny_model_built", path=str(out), **info)
    return out
