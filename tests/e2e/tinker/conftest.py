"""The official Tinker SDK against MinT on real services: one tiny Llama, one trainer worker
(`mint worker trainer`, a child process), two gateway instances in this process behind a
round-robin balancer (gateway.main.ThreadedServer, the Tinker API on /api/v1) and, for sampling
only, one vLLM engine (`mint worker serving`). One
topic prefix and keyspace for the module; each test makes tenants of its own.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


@pytest.fixture(scope="module")
def tk_model(tmp_path_factory) -> Path:
    from workers.models import TinySpec, build_tiny

    return build_tiny(TinySpec("llama", "test"), tmp_path_factory.mktemp("tk-model") / "llama")


@pytest.fixture(scope="module")
def tk_settings(kafka_ready, cassandra_cluster, tk_model, tmp_path_factory):
    """The module's prefix and keyspace (topics made, catalog migrated, dropped at the end); the
    base model is the tiny Llama (what the gateway offers and the trainer holds)."""
    from catalog.migrate import migrate
    from streams.topics import delete_topics, ensure_topics

    tag = uuid.uuid4().hex[:10]
    root = tmp_path_factory.mktemp("tk-state")
    s = kafka_ready.model_copy(
        update={
            "topic_prefix": f"tk{tag}",
            "keyspace": f"tk{tag}",
            "store_uri": str(root / "store"),
            "state_dir": root / "state",
            "base_model": str(tk_model),
        }
    )
    _, session = cassandra_cluster
    ensure_topics(s)
    migrate(session, s.keyspace, s.keyspace_replication)
    yield s
    session.execute(f"DROP KEYSPACE IF EXISTS {s.keyspace}", timeout=60)
    try:
        delete_topics(s)
    except Exception as e:  # cleanup only
        print(f"could not delete the module's topics: {e}")


@pytest.fixture(scope="module")
def tk_workers(tk_settings, tk_model, tmp_path_factory) -> Iterator:
    """The module's worker processes; the trainer starts at once, the engine on demand."""
    from mint.dev.workers import Workers

    workers = Workers(tk_settings, tk_model, tmp_path_factory.mktemp("tk-logs"))
    try:
        workers.start_worker("trainer")
        yield workers
    finally:
        workers.stop_all()


@pytest.fixture(scope="module")
def tk_engine(tk_workers, tk_model):
    """`mint worker serving` on the module's prefix: the sampling client's engine."""
    tk_workers.start(
        "engine",
        "serving",
        "--model",
        str(tk_model),
        "--engine-id",
        "tk-e2e",
        "--dtype",
        "float32",
        "--max-loras",
        "2",
        "--max-cpu-loras",
        "4",
        "--max-model-len",
        "256",
        "--max-lora-rank",
        "16",
        VLLM_CPU_OMP_THREADS_BIND="nobind",
    )
    return tk_workers


@pytest.fixture(scope="module")
def tk_gateway(tk_settings, tk_workers) -> Iterator[str]:
    """Two gateway instances in this process behind a round-robin balancer (no affinity, as a
    Service over replicas): every SDK call may reach either, so each test also checks that the
    instances share models, futures and saved states. Yields the balancer's URL."""
    from benchmarks._round_robin import RoundRobin
    from gateway.config import GatewayConfig
    from gateway.main import ThreadedServer, build

    servers = []
    try:
        for name in ("gw-tinker-a", "gw-tinker-b"):
            config = GatewayConfig(
                host="127.0.0.1",
                port=0,
                instance_id=name,
                answer_timeout_s=600.0,  # the first sample waits for vLLM to start on shared CPUs
                key_ttl_s=1.0,
                catalog_ttl_s=1.0,
            )
            servers.append(ThreadedServer(build(tk_settings, config)).start())
        balancer = RoundRobin([s.url for s in servers]).start()
        yield balancer.url
        balancer.stop()
        assert min(balancer.counts.values()) > 0, balancer.counts  # both took calls
    finally:
        for server in servers:
            server.stop()


@pytest.fixture(scope="module")
def tenant_key(tk_settings, cassandra_cluster) -> Callable[[], tuple[str, str]]:
    """Makes a new tenant and returns (its name, a Tinker API key of it: ``tml-`` + MinT key)."""
    from catalog.access import AccessRepository

    access = AccessRepository(cassandra_cluster[1], tk_settings.keyspace)

    def make() -> tuple[str, str]:
        name = f"t{uuid.uuid4().hex[:10]}"
        access.create_tenant(name, by="test")
        key, _ = access.create_key(name, name="tinker", by="test")
        return name, f"tml-{key.text}"

    return make
