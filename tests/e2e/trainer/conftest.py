"""Session-scoped tiny models (built once, ~2 s each) for the trainer's tests."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from workers.models import TinySpec, build_tiny

# Two cores are shared by every engineer's tests: one torch thread keeps steps fast and fair.
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tiny-models")
    return _Builder(root)


class _Builder(dict):
    """Builds each architecture on first use, so a test run only pays for what it touches."""

    def __init__(self, root: Path) -> None:
        super().__init__()
        self.root = root

    def __missing__(self, arch: str) -> Path:
        path = build_tiny(TinySpec(arch, "test", seed=0), self.root / arch)
        self[arch] = path
        return path


@pytest.fixture(scope="session")
def tiny_llama(tiny_models) -> Path:
    return tiny_models["llama"]
