"""The tiny Llama (built once per module) and a TrainerService over it with faked Kafka and
Cassandra (tests/unit/trainer/_helpers.py): the model is real."""

from __future__ import annotations

from pathlib import Path

import pytest

from catalog.store import AdapterStore
from tests.unit.trainer._helpers import FakeCatalog, FakeProducer
from workers.models import TinySpec, build_tiny
from workers.trainer import MultiPolicyTrainer, TrainerConfig
from workers.trainer.worker import TrainerService


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return build_tiny(TinySpec("llama", "test", seed=0), tmp_path_factory.mktemp("m") / "llama")


@pytest.fixture
def service(tiny: Path, tmp_path: Path):
    store = AdapterStore(tmp_path / "store")
    trainer = MultiPolicyTrainer(TrainerConfig(base_model=str(tiny), max_policies=2), store=store)
    yield TrainerService(trainer, store, FakeCatalog(), FakeProducer(), name="trainer/test")
    trainer.close()
