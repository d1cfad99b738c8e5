"""The lifecycle e2e tests: one tiny Llama per session, a migrated keyspace per test, the
demo's worker processes (projector, controller, trainer, one vLLM engine host)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


@pytest.fixture(scope="session", autouse=True)
def _sigterm_unwinds():
    """A SIGTERM (CI timeout) raises in the test, so its finally blocks stop the workers."""
    import signal

    def _raise(*_):
        raise KeyboardInterrupt("SIGTERM")

    previous = signal.signal(signal.SIGTERM, _raise)
    yield
    signal.signal(signal.SIGTERM, previous)


@pytest.fixture(scope="session")
def lifecycle_model(tmp_path_factory) -> Path:
    from workers.models import TinySpec, build_tiny

    return build_tiny(TinySpec("llama", "test"), tmp_path_factory.mktemp("models") / "llama")


@pytest.fixture
def lifecycle_settings(settings, cassandra_cluster, tmp_path):
    """The test's own prefix, keyspace (migrated, dropped afterwards) and state dir."""
    from catalog.migrate import migrate
    from streams.topics import ensure_topics

    logging.getLogger("kafka").setLevel(logging.ERROR)
    s = settings.model_copy(update={"state_dir": tmp_path / "state"})
    _, session = cassandra_cluster
    ensure_topics(s)
    migrate(session, s.keyspace, s.keyspace_replication)
    yield s
    session.execute(f"DROP KEYSPACE IF EXISTS {s.keyspace}", timeout=60)
    session.execute(f"DROP KEYSPACE IF EXISTS {s.keyspace}_rb", timeout=60)
