"""The one settings model (environment prefix ``MINT_``), shared by every layer.

It lives in ``schemas/`` so that ``streams``, ``catalog`` and ``workers`` can read it without
importing upward. Every value has a default that works on a developer machine with the local
launcher (``mint dev up``); production sets the ``MINT_*`` variables.
"""

from __future__ import annotations

import os
import re
from functools import lru_cache
from pathlib import Path
from typing import Annotated

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

LOOPBACK = {"127.0.0.1", "localhost", "::1", "[::1]"}
# A local cluster's node i listens on 127.0.0.i (all of 127/8 is this machine's loopback).
LOCAL_NODES = 5


def node_host(i: int) -> str:
    return f"127.0.0.{i}"


def cluster_defaults(nodes: int, kafka_port: int = 19092, cql_port: int = 19042) -> dict:
    """What MINT_DEV_NODES=N implies for the settings the user did not set: every node as a
    contact point, replication 3 (or N when smaller), two in-sync replicas of three, and
    NetworkTopologyStrategy in the one datacenter the local cluster has."""
    rf = min(3, nodes)
    hosts = [node_host(i) for i in range(1, nodes + 1)]
    return {
        "kafka_bootstrap": ",".join(f"{h}:{kafka_port}" for h in hosts),
        "cassandra_hosts": ",".join(hosts),
        "topic_replication": rf,
        "topic_min_insync": max(1, rf - 1),
        "keyspace_replication": f"{{'class': 'NetworkTopologyStrategy', 'datacenter1': {rf}}}",
    }


PROJECT_ROOT = Path(__file__).resolve().parent.parent
_MODULE_RE = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$"


def _loopback(host: str) -> bool:
    return host in LOOPBACK or host.startswith("127.")


def mint_home() -> Path:
    """Where MinT keeps its local state: ``MINT_HOME``; else the checkout's ``.mint`` when MinT
    runs from its source tree (``make``, an editable install); else ``~/.mint`` (a wheel)."""
    if home := os.environ.get("MINT_HOME"):
        return Path(home).expanduser()
    if (PROJECT_ROOT / "pyproject.toml").is_file() and (PROJECT_ROOT / "mint").is_dir():
        return PROJECT_ROOT / ".mint"
    return Path.home() / ".mint"


def _secret(value: SecretStr, path: Path | None, name: str) -> str:
    if path is None:
        return value.get_secret_value()
    try:
        return path.read_text().strip()
    except OSError as e:
        raise ValueError(
            f"{name}_FILE {path} cannot be read ({e}); mount the secret there or set {name}"
        ) from e


class MintSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="MINT_", extra="ignore", frozen=True)

    # Kafka. A non-loopback MINT_KAFKA_BOOTSTRAP (or MINT_KAFKA_EXTERNAL=true) names an external
    # cluster: the local launcher starts nothing and only checks it.
    kafka_bootstrap: str = Field("127.0.0.1:19092", description="host:port[,host:port…]")
    kafka_controller_port: int = Field(19093, description="local KRaft controller port")
    topic_prefix: str = Field("mint", pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
    topic_partitions: int = Field(3, ge=1, le=1024)
    topic_replication: int = Field(1, ge=1, le=7)
    # min.insync.replicas of every topic: with producers' acks=all, a write is confirmed once
    # this many replicas hold it (2 of 3: one broker down loses nothing and stops nothing).
    topic_min_insync: int = Field(1, ge=1, le=7)

    kafka_external: bool | None = Field(None, description="None: external unless on loopback")
    # Credentials come from here or from files (MINT_KAFKA_PASSWORD_FILE, mounted secrets),
    # never from code. PLAINTEXT: no authentication (the default local services).
    kafka_security_protocol: str = Field(
        "PLAINTEXT", pattern=r"^(PLAINTEXT|SASL_PLAINTEXT|SASL_SSL)$"
    )
    kafka_sasl_mechanism: str = Field("SCRAM-SHA-256", pattern=r"^SCRAM-SHA-(256|512)$")
    kafka_username: str = Field("", description="SASL/SCRAM principal of this process")
    kafka_password: SecretStr = Field(SecretStr(""), description="its password (or _file)")
    kafka_password_file: Path | None = Field(None, description="file holding the password")

    # Cassandra. Non-loopback MINT_CASSANDRA_HOSTS (or MINT_CASSANDRA_EXTERNAL=true) is external.
    cassandra_hosts: str = Field("127.0.0.1", description="comma-separated contact points")
    cassandra_port: int = Field(19042, ge=1, le=65535)
    cassandra_storage_port: int = Field(17000, ge=1, le=65535)
    cassandra_username: str = Field("", description="role of this process (empty: no auth)")
    cassandra_password: SecretStr = Field(SecretStr(""), description="its password (or _file)")
    cassandra_password_file: Path | None = Field(None, description="file holding the password")
    cassandra_external: bool | None = Field(None, description="None: external unless on loopback")
    keyspace: str = Field("mint", pattern=r"^[a-z][a-z0-9_]{0,47}$")
    keyspace_replication: str = Field(
        "{'class': 'SimpleStrategy', 'replication_factor': 1}",
        description="CQL replication map; clusters use NetworkTopologyStrategy",
    )

    # Files.
    state_dir: Path = Field(
        default_factory=mint_home, description="local service data, logs, pids (MINT_HOME)"
    )
    store_uri: str = Field("", description="adapter store root (file path; s3:// later)")
    models_dir: Path = Field(
        default_factory=lambda: mint_home() / "models", description="tiny/test models"
    )
    base_model: str = Field("", description="path or id of the base model to serve and train")

    # Local launcher.
    kafka_jars: Path | None = Field(None, description="folder of Kafka 4.4 jars")
    cassandra_jars: Path | None = Field(None, description="folder of Cassandra 5.0 jars")
    kafka_heap_mb: int = Field(512, ge=128, le=512)
    cassandra_heap_mb: int = Field(1024, ge=512, le=1024)
    cassandra_fast_schema: bool = Field(
        False,
        description="tests only: schema changes skip their flush (a keyspace migrates in ~2 s, "
        "not ~8); a kill -9 then forgets recent keyspaces (`make test` and .ci/run set it)",
    )
    startup_timeout_s: float = Field(120.0, gt=0)
    # MINT_DEV_NODES=3: the local launcher runs three Kafka brokers and three Cassandra nodes on
    # 127.0.0.1-3, and the cluster settings below default to them (cluster_defaults).
    dev_nodes: int = Field(1, ge=1, le=LOCAL_NODES)

    metrics_port: int | None = Field(
        None, ge=1, le=65535, description="serve Prometheus metrics of this process on the port"
    )
    log_level: str = Field("INFO", pattern=r"^(DEBUG|INFO|WARNING|ERROR)$")
    log_format: str = Field("json", pattern=r"^(json|console)$")

    # Rewards and suites named module:function in events are imported only from these module
    # prefixes (workers.plugins): an import runs code chosen by whoever may publish the event.
    # Empty: built-ins and installed entry points only. MINT_PLUGIN_MODULES=acme_tasks,lab.rl
    plugin_modules: Annotated[tuple[str, ...], NoDecode] = Field(
        (), description="module prefixes a module:function reward or suite may be imported from"
    )

    @model_validator(mode="before")
    @classmethod
    def _cluster_defaults(cls, data: object) -> object:
        if not isinstance(data, dict) or int(data.get("dev_nodes") or 1) <= 1:
            return data
        return {**cluster_defaults(int(data["dev_nodes"])), **data}

    @model_validator(mode="after")
    def _insync_within_replication(self) -> MintSettings:
        if self.topic_min_insync > self.topic_replication:
            raise ValueError(
                f"MINT_TOPIC_MIN_INSYNC={self.topic_min_insync} exceeds MINT_TOPIC_REPLICATION="
                f"{self.topic_replication}: no write could ever be confirmed; set it at most "
                "the replication factor (2 of 3 is the usual choice)"
            )
        return self

    @field_validator("kafka_bootstrap")
    @classmethod
    def _bootstrap_has_ports(cls, v: str) -> str:
        for part in v.split(","):
            host, _, port = part.strip().rpartition(":")
            if not host or not port.isdigit():
                raise ValueError(
                    f"MINT_KAFKA_BOOTSTRAP entry {part!r} is not host:port (e.g. 127.0.0.1:19092)"
                )
        return v

    @field_validator("plugin_modules", mode="before")
    @classmethod
    def _split_plugin_modules(cls, v: object) -> object:
        return tuple(p.strip() for p in v.split(",") if p.strip()) if isinstance(v, str) else v

    @field_validator("plugin_modules")
    @classmethod
    def _plugin_modules_are_modules(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for p in v:
            if not re.match(_MODULE_RE, p):
                raise ValueError(
                    f"MINT_PLUGIN_MODULES entry {p!r} is not a dotted module path: give "
                    "comma-separated module prefixes (e.g. acme_tasks,lab.rl)"
                )
        return v

    @property
    def cassandra_contact_points(self) -> list[str]:
        return [h.strip() for h in self.cassandra_hosts.split(",") if h.strip()]

    @property
    def kafka_is_external(self) -> bool:
        """True when Kafka is someone else's cluster, so the local launcher starts nothing."""
        if self.kafka_external is not None:
            return self.kafka_external
        hosts = [part.strip().rpartition(":")[0] for part in self.kafka_bootstrap.split(",")]
        return not all(_loopback(h) for h in hosts)

    @property
    def cassandra_is_external(self) -> bool:
        if self.cassandra_external is not None:
            return self.cassandra_external
        return not all(_loopback(h) for h in self.cassandra_contact_points)

    @property
    def kafka_secure(self) -> bool:
        return self.kafka_security_protocol != "PLAINTEXT"

    def kafka_secret(self) -> str:
        return _secret(self.kafka_password, self.kafka_password_file, "MINT_KAFKA_PASSWORD")

    def cassandra_secret(self) -> str:
        return _secret(
            self.cassandra_password, self.cassandra_password_file, "MINT_CASSANDRA_PASSWORD"
        )

    @property
    def adapter_store_root(self) -> Path:
        return Path(self.store_uri) if self.store_uri else self.state_dir / "store"

    def topic(self, name: str) -> str:
        """Full topic name for a registry name such as ``rollout.requests``."""
        return f"{self.topic_prefix}.{name}"


@lru_cache(maxsize=1)
def get_settings() -> MintSettings:
    """Process-wide settings read once from the environment."""
    return MintSettings()
