"""Adapter artifacts: the manifest, content digests, base-model fingerprints and the checks that
every adapter passes before it is stored or loaded.

A revision directory holds the PEFT files (``adapter_config.json``,
``adapter_model.safetensors``) plus ``manifest.json``, and for a MoE adapter
``adapter_packed.safetensors`` beside them (layout ``packed-moe``: expert factors stacked per
projection, ``catalog/packed.py``). The digest covers every content file present, the packed one
included (the adapter's identity: same bytes, same digest), so stock PEFT and vLLM load the
directory unchanged and the manifest can describe it without being part of it.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from safetensors import SafetensorError, safe_open

from catalog.exceptions import (
    AdapterCorrupted,
    AdapterShapeMismatch,
    NonFiniteWeights,
    UnsafeWeightsFormat,
)

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
MANIFEST_FILE = "manifest.json"
PACKED_FILE = "adapter_packed.safetensors"
ADAPTER_FILES = (CONFIG_FILE, WEIGHTS_FILE)
LAYOUT_PEFT = "peft"
LAYOUT_PACKED_MOE = "packed-moe"
MANIFEST_VERSION = 1

# Formats that can execute code when loaded (pickle) or that we cannot verify.
_UNSAFE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt", ".npy", ".npz")
_LORA_KEY = re.compile(r"^(?P<module>.+)\.lora_(?P<which>[AB])(?:\.[^.]+)?\.weight$")
_CHUNK = 1 << 20


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _digest_of(file_hashes: dict[str, str]) -> str:
    # Digest over (name, sha256) pairs in a fixed order: renaming a file changes it too.
    listing = "".join(f"{name}\0{file_hashes[name]}\n" for name in sorted(file_hashes))
    return "sha256:" + hashlib.sha256(listing.encode()).hexdigest()


def content_files(directory: Path) -> tuple[str, ...]:
    """The files a revision's digest covers: the PEFT files, and the packed file if present."""
    packed = (PACKED_FILE,) if (Path(directory) / PACKED_FILE).is_file() else ()
    return (*ADAPTER_FILES, *packed)


def adapter_digest(directory: Path) -> tuple[str, dict[str, str]]:
    """``("sha256:…", {file: sha256})`` of the content files in ``directory`` (a packed file that
    appears or disappears changes the digest, so it is verified like the PEFT files)."""
    hashes = {name: file_sha256(Path(directory) / name) for name in content_files(directory)}
    return _digest_of(hashes), hashes


def model_fingerprint(model_dir: Path | str) -> str:
    """``sha256:…`` over a base model's config and weights, stable across processes and hosts.

    Hashes ``config.json`` (canonical JSON, minus fields that name where or with what it was
    saved) and every ``*.safetensors`` file's sha256 in name order, so a re-saved copy of the
    same weights keeps its fingerprint and any changed weight changes it.
    """
    model_dir = Path(model_dir)
    config_path = model_dir / "config.json"
    if not config_path.is_file():
        raise FileNotFoundError(
            f"base model {str(model_dir)!r} has no config.json; give a transformers model folder"
        )
    config = json.loads(config_path.read_text())
    for volatile in ("_name_or_path", "transformers_version"):
        config.pop(volatile, None)
    weights = sorted(model_dir.glob("*.safetensors"))
    if not weights:
        raise UnsafeWeightsFormat(
            f"base model {str(model_dir)!r} has no *.safetensors weights; convert it to "
            "safetensors (pickle checkpoints are not fingerprinted or loaded)"
        )
    h = hashlib.sha256(json.dumps(config, sort_keys=True, separators=(",", ":")).encode())
    for w in weights:
        h.update(f"\0{w.name}\0{file_sha256(w)}".encode())
    return "sha256:" + h.hexdigest()


class Manifest(BaseModel):
    """``manifest.json`` of a stored revision."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    format_version: int = MANIFEST_VERSION
    digest: str = Field(pattern=r"^sha256:[0-9a-f]{64}$")
    files: dict[str, str] = Field(description="file name → sha256 hex of the content files")
    size_bytes: int = Field(ge=0, description="bytes of the content files")
    # "packed-moe": adapter_packed.safetensors sits beside the PEFT files. Older manifests have
    # no such field: they are "peft".
    layout: Literal["peft", "packed-moe"] = LAYOUT_PEFT
    tenant: str
    policy: str
    base_model: str = Field(min_length=1)
    base_model_fingerprint: str = Field(pattern=r"^sha256:[0-9a-f]{64}$")
    rank: int = Field(ge=1)
    lora_alpha: float = Field(gt=0)
    target_modules: list[str]
    target_parameters: list[str] = Field(default_factory=list)
    parent_revision: int | None = Field(None, ge=1)
    parent_digest: str | None = Field(None, pattern=r"^sha256:[0-9a-f]{64}$")
    training: dict[str, Any] = Field(default_factory=dict, description="objective, steps, loss…")
    created_at: datetime = Field(default_factory=lambda: datetime.now(UTC))


class AdapterShape(BaseModel):
    """What the adapter config says, after it was checked against the tensors."""

    model_config = ConfigDict(frozen=True)

    rank: int
    lora_alpha: float
    target_modules: list[str]
    target_parameters: list[str]
    tensors: int
    size_bytes: int


def _read_config(directory: Path) -> dict[str, Any]:
    path = directory / CONFIG_FILE
    if not path.is_file():
        raise AdapterShapeMismatch(
            f"{CONFIG_FILE} is missing in {str(directory)!r}; save the adapter with PEFT's "
            "save_pretrained()"
        )
    try:
        config = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise AdapterCorrupted(f"{CONFIG_FILE} in {str(directory)!r} is not JSON: {e}") from e
    if config.get("peft_type") != "LORA":
        raise AdapterShapeMismatch(
            f"{CONFIG_FILE}: peft_type={config.get('peft_type')!r}, expected 'LORA'"
        )
    return config


def _as_list(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        # PEFT allows a regex string; MinT stores explicit names so targets can be checked.
        raise AdapterShapeMismatch(
            f"{CONFIG_FILE}: target_modules={value!r} is a regex; give an explicit list of "
            "module names (e.g. ['q_proj', 'v_proj'])"
        )
    return sorted(str(v) for v in value)


def _check_formats(directory: Path) -> None:
    unsafe = sorted(p.name for p in directory.iterdir() if p.name.endswith(_UNSAFE_SUFFIXES))
    if unsafe:
        raise UnsafeWeightsFormat(
            f"{str(directory)!r} holds {unsafe}: pickle-based weights can run code when loaded "
            f"and are refused; save with safe_serialization=True ({WEIGHTS_FILE} only)"
        )
    if not (directory / WEIGHTS_FILE).is_file():
        raise UnsafeWeightsFormat(
            f"{WEIGHTS_FILE} is missing in {str(directory)!r}; MinT stores safetensors weights "
            "only (save_pretrained(..., safe_serialization=True))"
        )


def _module_of(key: str) -> tuple[str, str]:
    m = _LORA_KEY.match(key)
    if m is None:
        raise AdapterShapeMismatch(
            f"tensor {key!r} is not a LoRA A/B weight; only LoRA adapters without "
            "modules_to_save or biases are accepted"
        )
    # PEFT nests one ParamWrapper per targeted parameter ("experts.base_layer.lora_A").
    module = re.sub(r"(\.base_layer)+$", "", m.group("module"))
    return module, m.group("which")


def inspect_adapter(directory: Path | str) -> AdapterShape:
    """Check a PEFT LoRA directory and return its shape, or raise a refusal naming the problem.

    Refuses: pickle or missing safetensors weights; a tensor that is NaN/Inf; a rank or target
    list in ``adapter_config.json`` that the tensors contradict (every target needs tensors, every
    tensor a target, every A/B pair the configured rank, times the expert count for parameters).
    """
    directory = Path(directory)
    _check_formats(directory)
    config = _read_config(directory)
    rank, alpha = config.get("r"), config.get("lora_alpha")
    if not isinstance(rank, int) or rank < 1:
        raise AdapterShapeMismatch(f"{CONFIG_FILE}: r={rank!r}, expected a positive integer")
    if not isinstance(alpha, int | float) or alpha <= 0:
        raise AdapterShapeMismatch(f"{CONFIG_FILE}: lora_alpha={alpha!r}, expected > 0")
    # PEFT writes rank_pattern itself for fused MoE weights (gate+up → 2r); accept the ranks it
    # names, checked as a set because a fused parameter's key no longer shows its pattern.
    pattern = config.get("rank_pattern") or {}
    if not all(isinstance(v, int) and v >= 1 for v in pattern.values()):
        raise AdapterShapeMismatch(f"{CONFIG_FILE}: rank_pattern={pattern!r} needs ranks >= 1")
    ranks = sorted({rank, *pattern.values()})
    targets = _as_list(config.get("target_modules"))
    params = _as_list(config.get("target_parameters"))
    # "mlp.experts.gate_up_proj" names its module; a bare "gate_up_proj" (as PEFT's v4→v5 MoE
    # conversion writes it) may sit in any module, so it is matched by rank alone.
    param_modules = {p.rsplit(".", 1)[0] for p in params if "." in p}
    bare_params = any("." not in p for p in params)
    if not targets and not params:
        raise AdapterShapeMismatch(f"{CONFIG_FILE}: no target_modules or target_parameters")

    seen: set[str] = set()
    n, size = 0, 0
    try:
        with safe_open(str(directory / WEIGHTS_FILE), framework="pt") as f:
            keys = list(f.keys())
            for key in keys:
                t = f.get_tensor(key)
                n += 1
                size += t.numel() * t.element_size()
                if t.is_floating_point() and not bool(t.isfinite().all()):
                    bad = int((~t.isfinite()).sum())
                    raise NonFiniteWeights(
                        f"tensor {key!r} holds {bad} NaN/Inf value(s) of {t.numel()}; the "
                        "training step diverged — lower the learning rate or check the data"
                    )
                module, which = _module_of(key)
                dim = t.shape[0] if which == "A" else t.shape[-1]
                matched = next((tm for tm in targets if _matches(module, tm)), None)
                if matched is not None and dim in ranks:
                    seen.add(matched)
                    continue
                pmatch = next((pm for pm in sorted(param_modules) if _matches(module, pm)), None)
                if pmatch is not None and any(dim % r == 0 for r in ranks):
                    seen.add(pmatch)
                    continue
                if matched is None and bare_params and any(dim % r == 0 for r in ranks):
                    continue
                if matched is None and pmatch is None:
                    raise AdapterShapeMismatch(
                        f"tensor {key!r} belongs to module {module!r}, which is not in "
                        f"target_modules={targets} or target_parameters={params}; fix the "
                        "adapter config to list it"
                    )
                raise AdapterShapeMismatch(
                    f"tensor {key!r} has rank dimension {dim} but r={rank} (ranks {ranks}) in "
                    f"{CONFIG_FILE}; "
                    "the config and the weights come from different adapters"
                )
    except SafetensorError as e:
        raise UnsafeWeightsFormat(
            f"{WEIGHTS_FILE} in {str(directory)!r} is not a readable safetensors file ({e})"
        ) from e
    missing = sorted((set(targets) | param_modules) - seen)
    if missing:
        raise AdapterShapeMismatch(
            f"{CONFIG_FILE} targets {missing} but {WEIGHTS_FILE} has no LoRA tensors for them; "
            "the config and the weights come from different adapters"
        )
    return AdapterShape(
        rank=rank,
        lora_alpha=float(alpha),
        target_modules=targets,
        target_parameters=params,
        tensors=n,
        size_bytes=size,
    )


def _matches(module: str, target: str) -> bool:
    # PEFT's rule for names in target_modules: the full name or a dotted suffix.
    return module == target or module.endswith("." + target)


def read_manifest(directory: Path) -> Manifest:
    path = Path(directory) / MANIFEST_FILE
    try:
        return Manifest.model_validate_json(path.read_bytes())
    except FileNotFoundError as e:
        raise AdapterCorrupted(f"{MANIFEST_FILE} is missing in {str(directory)!r}") from e
    except ValueError as e:
        raise AdapterCorrupted(f"{MANIFEST_FILE} in {str(directory)!r} is invalid: {e}") from e


def check_manifest_matches(manifest: Manifest, shape: AdapterShape) -> None:
    """The manifest's rank/alpha/targets must be what the adapter config and tensors say."""
    for field, have in (
        ("rank", shape.rank),
        ("lora_alpha", shape.lora_alpha),
        ("target_modules", shape.target_modules),
        ("target_parameters", shape.target_parameters),
    ):
        recorded = getattr(manifest, field)
        if isinstance(have, float):
            equal = math.isclose(recorded, have)
        elif isinstance(have, list):
            equal = sorted(recorded) == have
        else:
            equal = recorded == have
        if not equal:
            raise AdapterShapeMismatch(
                f"{MANIFEST_FILE}: {field}={recorded!r} but the adapter has {have!r}; the "
                "manifest was edited or belongs to another adapter"
            )
