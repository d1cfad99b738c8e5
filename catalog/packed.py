"""Packed MoE LoRA: each MoE layer's expert factors as one tensor per projection, not per expert.

Three layouts of the same expert LoRA factors (``E`` experts, rank ``r`` of that projection):

- **PEFT** (what the trainer writes; transformers 5 keeps experts as fused 3-D parameters and PEFT
  wraps each targeted parameter in a ``ParamWrapper``): per experts module, one ``lora_A``
  ``[E·r, in]`` (expert-major rows) and one ``lora_B`` ``[out, r·E]`` (expert-MINOR columns) per
  parameter. Several parameters on one module nest: the parameter registered first is the
  innermost wrapper, so with ``gate_up_proj`` and ``down_proj`` targeted,
  ``….mlp.experts.base_layer.lora_A.weight`` is ``gate_up_proj`` and
  ``….mlp.experts.lora_A.weight`` is ``down_proj`` (vLLM's 3-D MoE LoRA path reads it so too).
- **per-expert** (vLLM's 2-D MoE LoRA loader, older PEFT models with one ``nn.Linear`` per
  expert): ``….mlp.experts.{i}.{proj}.lora_A.weight`` ``[r, in]`` and ``….lora_B.weight``
  ``[out, r]``, ``E`` times per projection.
- **packed** (``adapter_packed.safetensors`` in the store):
  ``….mlp.experts.{proj}.lora_A.stacked`` ``[E, r, in]`` and
  ``….mlp.experts.{proj}.lora_B.stacked`` ``[E, out, r]``: what vLLM's fused-MoE LoRA layer copies
  into its slots, read with one safetensors load. Expert ``e``'s update is
  ``scaling · B[e] @ A[e]`` (``[out, in]``, a Linear weight). Every other LoRA tensor of the
  adapter (attention, dense layers) is in the packed file too, under its PEFT key, so one file
  holds the whole adapter. The file's metadata (``mint_packed``, JSON) names each packed
  projection's PEFT key, expert count and rank, so the PEFT layout is rebuilt bit for bit.

All conversions are reshapes, permutes, stacks and slices: lossless (``torch.equal``) both ways.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save

from catalog.artifacts import (
    CONFIG_FILE,
    LAYOUT_PACKED_MOE,
    LAYOUT_PEFT,
    PACKED_FILE,
    WEIGHTS_FILE,
)
from catalog.exceptions import AdapterCorrupted, AdapterShapeMismatch

log = structlog.get_logger()

META_KEY = "mint_packed"
PACKED_VERSION = 1
# Registration order of expert parameters in transformers 5 experts modules (Qwen3-MoE,
# DeepSeek-V3, Mixtral, …: gate_up_proj, then down_proj). PEFT nests wrappers in this order.
PARAM_ORDER = ("gate_up_proj", "gate_proj", "up_proj", "down_proj")
_PEFT_PREFIX = "base_model.model."
_PEFT_KEY = re.compile(r"^(?P<stem>.+)\.lora_(?P<which>[AB])\.weight$")
_STACKED_KEY = re.compile(r"^(?P<stem>.+)\.lora_(?P<which>[AB])\.stacked$")
_PER_EXPERT_KEY = re.compile(
    r"^(?P<module>.+\.experts)\.(?P<expert>\d+)\.(?P<proj>[^.]+)\.lora_(?P<which>[AB])\.weight$"
)


@dataclass(frozen=True)
class PackedProjection:
    """One packed projection: ``<stem>.lora_A.stacked`` / ``<stem>.lora_B.stacked``."""

    stem: str  # "<experts module>.<projection>", e.g. "….layers.0.mlp.experts.gate_up_proj"
    peft: str  # its PEFT key stem ("….mlp.experts.base_layer"), "" if it came per expert
    experts: int
    rank: int

    @property
    def module(self) -> str:
        return self.stem.rsplit(".", 1)[0]

    @property
    def projection(self) -> str:
        return self.stem.rsplit(".", 1)[1]


def stacked_keys(stem: str) -> tuple[str, str]:
    return f"{stem}.lora_A.stacked", f"{stem}.lora_B.stacked"


def pattern_value(patterns: dict[str, Any] | None, key: str, default: Any) -> Any:
    """PEFT's ``rank_pattern`` / ``alpha_pattern`` lookup (``peft.utils.other.get_pattern_key``)."""
    for pattern, value in (patterns or {}).items():
        if re.match(rf"(.*\.)?({pattern})$", key):
            return value
    return default


def projection_rank(config: dict[str, Any], module: str, param: str) -> int:
    return int(pattern_value(config.get("rank_pattern"), _model_key(module, param), config["r"]))


def _model_key(module: str, param: str) -> str:
    # PEFT matches patterns against names inside the base model (no "base_model.model." prefix).
    return f"{module.removeprefix(_PEFT_PREFIX)}.{param}"


def _targeted_params(module: str, config: dict[str, Any], order: tuple[str, ...]) -> list[str]:
    """Names of the parameters of ``module`` that ``target_parameters`` names, innermost first.

    A bare name (``"down_proj"``) applies to any module except a ``target_modules`` one: PEFT
    refuses to wrap parameters of a module it already wraps as a layer."""
    modules = config.get("target_modules") or []
    if isinstance(modules, str):  # PEFT's regex form: a full match of the model's module name
        layer = re.fullmatch(modules, module.removeprefix(_PEFT_PREFIX)) is not None
    else:
        layer = any(module == t or module.endswith("." + t) for t in modules)
    names = set()
    for target in config.get("target_parameters") or []:
        owner, _, name = target.rpartition(".")
        key = f"{module}.{name}"
        hit = (key == target or key.endswith("." + target)) if owner else not layer
        if hit:
            names.add(name)
    unknown = sorted(names - set(order))
    if unknown:
        raise AdapterShapeMismatch(
            f"{module}: target parameters {unknown} have no known nesting order (known: "
            f"{list(order)}); pass param_order= with the experts module's registration order"
        )
    return [n for n in order if n in names]


# PEFT ⇄ packed.


def peft_to_packed(
    tensors: dict[str, torch.Tensor],
    config: dict[str, Any],
    param_order: tuple[str, ...] = PARAM_ORDER,
) -> tuple[dict[str, torch.Tensor], list[PackedProjection]]:
    """The packed tensors (expert factors stacked; other LoRA tensors unchanged) and what was
    packed. ``config`` is the adapter's ``adapter_config.json``. Only parameters with more than one
    expert are packed; an adapter without any comes back unchanged with an empty list."""
    stems: dict[str, set[str]] = {}
    for key in tensors:
        m = _PEFT_KEY.match(key)
        if m is not None:
            stems.setdefault(m.group("stem"), set()).add(m.group("which"))
    by_module: dict[str, list[tuple[int, str]]] = {}
    for stem in stems:
        module, depth = stem, 0
        while module.endswith(".base_layer"):
            module, depth = module.removesuffix(".base_layer"), depth + 1
        by_module.setdefault(module, []).append((depth, stem))

    out = dict(tensors)
    packed: list[PackedProjection] = []
    for module, wrapped in sorted(by_module.items()):
        params = _targeted_params(module, config, param_order)
        if not params:
            continue  # a target_modules Linear (or nothing PEFT would wrap as a parameter)
        depths = sorted(d for d, _ in wrapped)
        if depths != list(range(len(params))):
            raise AdapterShapeMismatch(
                f"{module}: {len(params)} targeted parameters {params} but LoRA tensors at "
                f"nesting depths {depths}; the config and the weights disagree"
            )
        for depth, stem in wrapped:
            if stems[stem] != {"A", "B"}:
                raise AdapterShapeMismatch(f"{stem}: needs both lora_A and lora_B")
            param = params[len(params) - 1 - depth]  # the first registered is the innermost
            a, b = tensors[f"{stem}.lora_A.weight"], tensors[f"{stem}.lora_B.weight"]
            rank = projection_rank(config, module, param)
            rows = a.shape[0]
            if a.dim() != 2 or b.dim() != 2 or rows % rank or b.shape[1] != rows:
                raise AdapterShapeMismatch(
                    f"{stem} ({param}): lora_A {tuple(a.shape)} and lora_B {tuple(b.shape)} are "
                    f"not [experts·{rank}, in] and [out, {rank}·experts]"
                )
            experts = rows // rank
            if experts == 1:
                continue  # a 2-D parameter: nothing to stack
            del out[f"{stem}.lora_A.weight"], out[f"{stem}.lora_B.weight"]
            key_a, key_b = stacked_keys(f"{module}.{param}")
            out[key_a] = a.reshape(experts, rank, a.shape[1]).clone()
            out[key_b] = b.reshape(b.shape[0], rank, experts).permute(2, 0, 1).contiguous()
            packed.append(PackedProjection(f"{module}.{param}", stem, experts, rank))
    return out, packed


def packed_to_peft(
    tensors: dict[str, torch.Tensor], packed: list[PackedProjection]
) -> dict[str, torch.Tensor]:
    """The PEFT tensors (exactly as the trainer wrote them) from packed tensors."""
    out = {k: v for k, v in tensors.items() if not k.endswith(".stacked")}
    for p in packed:
        if not p.peft:
            raise AdapterShapeMismatch(
                f"{p.stem} was packed from per-expert tensors: it has no PEFT parameter layout"
            )
        a, b = _stacked(tensors, p.stem)
        out[f"{p.peft}.lora_A.weight"] = a.reshape(p.experts * p.rank, a.shape[-1]).clone()
        out[f"{p.peft}.lora_B.weight"] = (
            b.permute(1, 2, 0).reshape(b.shape[1], p.rank * p.experts).contiguous()
        )
    return out


def _stacked(tensors: dict[str, torch.Tensor], stem: str) -> tuple[torch.Tensor, torch.Tensor]:
    key_a, key_b = stacked_keys(stem)
    try:
        return tensors[key_a], tensors[key_b]
    except KeyError as e:
        raise AdapterCorrupted(f"packed tensors lack {e.args[0]!r}") from e


# Per-expert ⇄ packed.


def packed_to_per_expert(
    tensors: dict[str, torch.Tensor], split_gate_up: bool = False
) -> dict[str, torch.Tensor]:
    """``….experts.{i}.{proj}.lora_{A,B}.weight`` for every expert (other tensors unchanged).

    With ``split_gate_up`` a fused ``gate_up_proj`` becomes vLLM's ``gate_proj`` (the first half
    of its output rows) and ``up_proj`` (the second half), both with the shared ``lora_A``."""
    out = {k: v for k, v in tensors.items() if not k.endswith(".stacked")}
    for stem in stacked_stems(tensors):
        module, proj = stem.rsplit(".", 1)
        a, b = _stacked(tensors, stem)
        parts = [(proj, b)]
        if split_gate_up and proj == "gate_up_proj":
            half = _half(b, stem)
            parts = [("gate_proj", b[:, :half]), ("up_proj", b[:, half:])]
        for name, bs in parts:
            for e in range(a.shape[0]):
                out[f"{module}.{e}.{name}.lora_A.weight"] = a[e].clone()
                out[f"{module}.{e}.{name}.lora_B.weight"] = bs[e].clone()
    return out


def per_expert_to_packed(
    tensors: dict[str, torch.Tensor], fuse_gate_up: bool = False
) -> dict[str, torch.Tensor]:
    """Stack ``….experts.{i}.{proj}.lora_{A,B}.weight`` into ``[E, r, in]`` / ``[E, out, r]``.

    With ``fuse_gate_up``, ``gate_proj`` and ``up_proj`` whose ``lora_A`` are equal for every
    expert (as :func:`packed_to_per_expert` writes them) become one ``gate_up_proj`` again."""
    groups: dict[tuple[str, str, str], dict[int, torch.Tensor]] = {}
    out = {}
    for key, t in tensors.items():
        m = _PER_EXPERT_KEY.match(key)
        if m is None:
            out[key] = t
            continue
        groups.setdefault((m["module"], m["proj"], m["which"]), {})[int(m["expert"])] = t
    stacks: dict[tuple[str, str], dict[str, torch.Tensor]] = {}
    for (module, proj, which), experts in groups.items():
        if sorted(experts) != list(range(len(experts))):
            raise AdapterShapeMismatch(
                f"{module}.*.{proj}.lora_{which}: experts {sorted(experts)} are not 0..n-1"
            )
        shapes = {tuple(t.shape) for t in experts.values()}
        if len(shapes) != 1:
            raise AdapterShapeMismatch(f"{module}.*.{proj}.lora_{which}: shapes differ {shapes}")
        stacks.setdefault((module, proj), {})[which] = torch.stack(
            [experts[i] for i in range(len(experts))]
        )
    for (module, proj), ab in sorted(stacks.items()):
        if set(ab) != {"A", "B"}:
            raise AdapterShapeMismatch(f"{module}.*.{proj}: needs both lora_A and lora_B")
        if proj in ("gate_proj", "up_proj") and fuse_gate_up:
            gate, up = stacks.get((module, "gate_proj")), stacks.get((module, "up_proj"))
            if gate and up and torch.equal(gate["A"], up["A"]):
                if proj == "gate_proj":
                    key_a, key_b = stacked_keys(f"{module}.gate_up_proj")
                    out[key_a] = gate["A"]
                    out[key_b] = torch.cat([gate["B"], up["B"]], dim=1)
                continue
        key_a, key_b = stacked_keys(f"{module}.{proj}")
        out[key_a], out[key_b] = ab["A"], ab["B"]
    return out


def stacked_stems(tensors: dict[str, torch.Tensor]) -> list[str]:
    """``<experts module>.<projection>`` of every packed projection in ``tensors``."""
    return sorted({m["stem"] for k in tensors if (m := _STACKED_KEY.match(k)) is not None})


def _half(b: torch.Tensor, stem: str) -> int:
    if b.shape[1] % 2:
        raise AdapterShapeMismatch(f"{stem}: lora_B has {b.shape[1]} output rows, not 2·I")
    return b.shape[1] // 2


# Files.


def packed_bytes(tensors: dict[str, torch.Tensor], packed: list[PackedProjection]) -> bytes:
    """The packed file's bytes: the same tensors give the same bytes (one metadata key, sorted
    JSON), so the revision digest over them is stable."""
    meta = {
        "layout": LAYOUT_PACKED_MOE,
        "version": PACKED_VERSION,
        "projections": {
            p.stem: {"peft": p.peft, "experts": p.experts, "rank": p.rank} for p in packed
        },
    }
    return save(tensors, metadata={META_KEY: json.dumps(meta, sort_keys=True)})


def write_packed(directory: Path | str, param_order: tuple[str, ...] = PARAM_ORDER) -> str:
    """Write ``adapter_packed.safetensors`` beside the PEFT files in ``directory`` when the adapter
    has expert factors to pack; return the layout (``packed-moe`` or ``peft``: nothing written).
    An adapter whose expert nesting cannot be told is left in the PEFT layout (logged)."""
    directory = Path(directory)
    config = json.loads((directory / CONFIG_FILE).read_text())
    if not config.get("target_parameters"):
        return LAYOUT_PEFT
    tensors = load_file(str(directory / WEIGHTS_FILE))
    try:
        out, packed = peft_to_packed(tensors, config, param_order)
    except AdapterShapeMismatch as e:
        log.warning("adapter_not_packed", path=str(directory), reason=str(e))
        return LAYOUT_PEFT
    if not packed:
        return LAYOUT_PEFT
    (directory / PACKED_FILE).write_bytes(packed_bytes(out, packed))
    return LAYOUT_PACKED_MOE


def read_packed(
    directory: Path | str,
) -> tuple[dict[str, torch.Tensor], list[PackedProjection]] | None:
    """The packed tensors and their projections, or None when the revision has no packed file."""
    path = Path(directory) / PACKED_FILE
    if not path.is_file():
        return None
    with safe_open(str(path), framework="pt") as f:
        meta_json = (f.metadata() or {}).get(META_KEY)
    if meta_json is None:
        raise AdapterCorrupted(f"{path}: no {META_KEY!r} metadata; not a MinT packed file")
    meta = json.loads(meta_json)
    if meta.get("version") != PACKED_VERSION or meta.get("layout") != LAYOUT_PACKED_MOE:
        raise AdapterCorrupted(
            f"{path}: packed layout {meta.get('layout')!r} v{meta.get('version')} is not "
            f"{LAYOUT_PACKED_MOE!r} v{PACKED_VERSION}; re-export the revision"
        )
    packed = [
        PackedProjection(stem, p["peft"], p["experts"], p["rank"])
        for stem, p in sorted(meta["projections"].items())
    ]
    return load_file(str(path)), packed


def read_peft_weights(directory: Path | str) -> dict[str, torch.Tensor] | None:
    """The adapter's PEFT state dict rebuilt from its packed file (None: no packed file)."""
    got = read_packed(directory)
    return None if got is None else packed_to_peft(*got)
