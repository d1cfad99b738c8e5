"""`mint models tiny`: deterministic bytes, loadable folders, process-stable fingerprints."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from transformers import AutoModelForCausalLM, AutoTokenizer

from catalog.artifacts import file_sha256, model_fingerprint
from mint.cli import main


def build(out: Path, arch: str = "llama", seed: int = 0) -> Path:
    result = CliRunner().invoke(
        main, ["models", "tiny", "--arch", arch, "--out", str(out), "--seed", str(seed)]
    )
    assert result.exit_code == 0, result.output
    return out


def test_same_seed_same_bytes_and_another_seed_other_weights(tmp_path: Path) -> None:
    a, b = build(tmp_path / "a"), build(tmp_path / "b")
    c = build(tmp_path / "c", seed=1)
    files = sorted(p.name for p in a.iterdir())
    assert "model.safetensors" in files and "tokenizer.json" in files
    for name in files:
        assert file_sha256(a / name) == file_sha256(b / name), name
    assert file_sha256(a / "model.safetensors") != file_sha256(c / "model.safetensors")
    assert model_fingerprint(a) == model_fingerprint(b) != model_fingerprint(c)
    # The fingerprint is the same when another process computes it.
    other = subprocess.run(
        [
            sys.executable,
            "-c",
            f"from catalog.artifacts import model_fingerprint; print(model_fingerprint({str(a)!r}))",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert other == model_fingerprint(a)


@pytest.mark.parametrize("arch", ["llama", "qwen3-moe", "deepseek-v3"])
def test_folders_load_in_transformers(tiny_models, arch: str) -> None:
    path = tiny_models[arch]
    model = AutoModelForCausalLM.from_pretrained(str(path))
    tok = AutoTokenizer.from_pretrained(str(path))
    assert sum(p.numel() for p in model.parameters()) <= 20_000_000
    ids = tok("question: 2 plus 2 equals? answer: 4", return_tensors="pt").input_ids
    assert ids[0, 0].item() == tok.bos_token_id
    assert model(input_ids=ids).logits.shape == (1, ids.shape[1], model.config.vocab_size)


def test_occupied_folder_is_refused(tmp_path: Path) -> None:
    build(tmp_path / "a")
    result = CliRunner().invoke(
        main, ["models", "tiny", "--arch", "llama", "--out", str(tmp_path / "a")]
    )
    # The console wraps long paths: compare with whitespace collapsed.
    assert result.exit_code == 1 and "exists and is not empty" in " ".join(result.output.split())
