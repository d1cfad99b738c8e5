"""A tiny Llama built once per session, and a live (topics + migrated keyspace) environment."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from workers.models import TinySpec, build_tiny

torch.set_num_threads(1)  # two shared cores


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny(TinySpec("llama", "test", seed=0), tmp_path_factory.mktemp("m") / "llama")
