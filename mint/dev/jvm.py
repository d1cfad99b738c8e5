"""The JVM command lines of the local services: which jars, which rendered config, which flags,
for one ``Service`` (a managed JVM, as ``launcher.py`` starts and stops it).

One node (``mint dev up``) or one node of a local cluster (``MINT_DEV_NODES=3``): node i binds
127.0.0.i on the same ports, so the configs differ only in address, node id and the quorum.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import structlog

from schemas.exceptions import MintError
from schemas.settings import PROJECT_ROOT, MintSettings, node_host

log = structlog.get_logger()

# The services' config templates ship inside the package (an installed wheel has them too).
SERVICE_CONFIGS = Path(__file__).resolve().parent / "services"
# The jars vendored beside a checkout (../shared/vendor/jvm); an installed MinT has none there
# and uses MINT_KAFKA_JARS / MINT_CASSANDRA_JARS or a Maven-fetched copy under MINT_HOME.
VENDORED_JVM = PROJECT_ROOT.parent / "shared" / "vendor" / "jvm"


# How fast a cluster notices a broker is gone (deploy/kafka/start-secure.sh writes the same).
# A killed broker's partitions have no leader until the active controller fences it: its
# session (default 9 s) and, when the killed broker was the active controller, a new election
# first (the voters' fetch timeout, default 2 s, then the election's). The two voters left
# notice together and often split the vote; each then backs off a random time up to the
# election backoff (default 1 s) before asking again. A follower in the ISR that stops
# fetching holds every acks=all write until it is dropped (default 30 s).
CLUSTER_BROKER_TIMINGS = {
    "broker.heartbeat.interval.ms": "500",
    "broker.session.timeout.ms": "2000",
    "controller.quorum.fetch.timeout.ms": "1000",
    "controller.quorum.election.timeout.ms": "500",
    "controller.quorum.election.backoff.max.ms": "200",
    "replica.lag.time.max.ms": "5000",
}


@dataclass(frozen=True)
class Service:
    """One managed JVM: a Kafka broker or a Cassandra node."""

    name: str  # "kafka" | "cassandra" alone; "kafka-2" | "cassandra-3" in a local cluster
    kind: str  # "kafka" | "cassandra"
    node: int  # 1..N: its node id, and its address 127.0.0.<node>
    port: int
    home: Path  # state folder of this node
    log_file: Path

    @property
    def host(self) -> str:
        return node_host(self.node)

    @property
    def node_of_cluster(self) -> bool:
        return self.name != self.kind

    @property
    def pid_file(self) -> Path:
        return self.home / f"{self.kind}.pid"


class LauncherError(MintError, RuntimeError):
    """A local service could not be prepared, started or stopped; the message says what to do."""


def java_binary() -> str:
    java_home = os.environ.get("JAVA_HOME")
    java = str(Path(java_home) / "bin" / "java") if java_home else shutil.which("java")
    if not java or not Path(java).exists():
        raise LauncherError(
            "Java 17 is required: install a JDK 17 and put `java` on PATH or set JAVA_HOME"
        )
    out = subprocess.run([java, "-version"], capture_output=True, text=True).stderr
    m = re.search(r'version "(\d+)', out)
    if not m or int(m.group(1)) < 17:
        raise LauncherError(f"Java 17 or newer is required, found: {out.strip().splitlines()[0]!r}")
    return java


def resolve_jars(name: str, settings: MintSettings) -> Path:
    """The jar folder for ``name``: the setting, the vendored copy, a cached Maven copy, or Maven."""
    configured = settings.kafka_jars if name == "kafka" else settings.cassandra_jars
    if configured is not None:
        if not any(Path(configured).glob("*.jar")):
            raise LauncherError(f"MINT_{name.upper()}_JARS={configured} holds no .jar files")
        return Path(configured)
    return _local_jars(name, settings) or _maven_fetch(name, settings.state_dir / "jars" / name)


def _local_jars(name: str, settings: MintSettings) -> Path | None:
    """The vendored or cached jar folder for ``name``, if there is one (no fetching)."""
    for candidate in (VENDORED_JVM / name, settings.state_dir / "jars" / name):
        if any(candidate.glob("*.jar")):
            return candidate
    return None


def _maven_fetch(name: str, dest: Path) -> Path:
    mvn = shutil.which("mvn")
    pom = SERVICE_CONFIGS / f"{name}-pom.xml"
    if not mvn:
        raise LauncherError(
            f"no {name} jars found: set MINT_{name.upper()}_JARS to a folder of jars, "
            f"or install Maven so that `mvn -f {pom} dependency:copy-dependencies` can fetch them"
        )
    log.info("fetching jars with maven", service=name, dest=str(dest))
    cmd = [
        mvn,
        "-q",
        "-f",
        str(pom),
        "dependency:copy-dependencies",
        "-DincludeScope=runtime",
        f"-DoutputDirectory={dest}",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        shutil.rmtree(dest, ignore_errors=True)
        raise LauncherError(
            f"maven could not fetch {name} jars (is Maven Central reachable?):\n{proc.stdout[-2000:]}"
        )
    return dest


# ---------------------------------------------------------------- config rendering


def _render(template: str, dest: Path, values: dict[str, str]) -> None:
    text = (SERVICE_CONFIGS / template).read_text()
    for key, value in values.items():
        text = text.replace(f"@{key}@", value)
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(text)


def kafka_command(settings: MintSettings, svc: Service, java: str) -> list[str]:
    jars = resolve_jars("kafka", settings)
    props = svc.home / "server.properties"
    nodes = settings.dev_nodes
    rf = min(3, nodes)
    if nodes == 1:  # a quorum of one, formatted --standalone
        quorum = f"controller.quorum.bootstrap.servers={svc.host}:{settings.kafka_controller_port}"
    else:  # a static quorum of every node; each is a voter
        quorum = "controller.quorum.voters=" + ",".join(
            f"{i}@{node_host(i)}:{settings.kafka_controller_port}" for i in range(1, nodes + 1)
        )
    values = {
        "STATE": str(svc.home),
        "HOST": svc.host,
        "NODE_ID": str(svc.node),
        "QUORUM": quorum,
        "RF": str(rf),
        "MIN_ISR": str(max(1, rf - 1)),
        "KAFKA_PORT": str(svc.port),
        "CONTROLLER_PORT": str(settings.kafka_controller_port),
    }
    scram: list[str] = []
    if settings.kafka_secure:
        from mint.dev.secure import ensure_secrets, scram_format_args

        values["ADMIN_PASSWORD"] = ensure_secrets(settings.state_dir)["kafka-admin"]
        scram = scram_format_args(settings.state_dir)
    _render(
        "server-secure.properties.in" if settings.kafka_secure else "server.properties.in",
        props,
        values,
    )
    if nodes > 1:
        with props.open("a") as f:
            f.write("".join(f"{k}={v}\n" for k, v in CLUSTER_BROKER_TIMINGS.items()))
    if settings.kafka_secure:
        os.chmod(props, 0o600)  # it holds the broker's own password
    common = [
        "-cp",
        ":".join([f"{jars}/*", *map(str, _slf4j1_binding(jars, settings))]),
        f"-Dlog4j2.configurationFile={SERVICE_CONFIGS / 'log4j2.xml'}",
        f"-Dlogback.configurationFile={SERVICE_CONFIGS / 'kafka-logback.xml'}",
        f"-Dkafka.logs.dir={svc.log_file.parent}",
    ]
    if not (svc.home / "kafka-data" / "meta.properties").exists():
        standalone = ["--standalone"] if nodes == 1 else []
        fmt = subprocess.run(
            [java, *common, "kafka.tools.StorageTool", "format", *standalone, "-t"]
            + [_cluster_id(svc, java, jars), "-c", str(props), *scram],
            capture_output=True,
            text=True,
        )
        if fmt.returncode != 0:
            raise LauncherError(f"kafka storage format failed:\n{fmt.stdout}{fmt.stderr}")
    heap = f"{settings.kafka_heap_mb}m"
    return [java, f"-Xms{heap}", f"-Xmx{heap}", *common, "kafka.Kafka", str(props)]


def _slf4j1_binding(jars: Path, settings: MintSettings) -> list[Path]:
    """Logback's jars for a Kafka folder whose slf4j-api is 1.x with no 1.x binding (the
    vendored one: its only binding is for slf4j 2, so the broker logged nothing at all). They
    come from the Cassandra folder, which binds slf4j 1.7 with logback; none when absent."""
    if not any(jars.glob("slf4j-api-1.*.jar")) or any(jars.glob("logback-classic-*.jar")):
        return []
    cassandra = settings.cassandra_jars or _local_jars("cassandra", settings)
    if cassandra is None:
        return []
    found = [
        sorted(Path(cassandra).glob(f"logback-{part}-1.*.jar")) for part in ("classic", "core")
    ]
    return [jars_of[-1] for jars_of in found] if all(found) else []


def _cluster_id(svc: Service, java: str, jars: Path) -> str:
    """One id for every broker of a cluster (kept beside their folders), a new one per node."""
    kept = svc.home.parent / "kafka-cluster-id" if svc.node_of_cluster else None
    if kept is not None and kept.exists():
        return kept.read_text().strip()
    cluster_id = (
        subprocess.run(
            [java, "-cp", f"{jars}/*", "kafka.tools.StorageTool", "random-uuid"],
            capture_output=True,
            text=True,
            check=True,
        )
        .stdout.strip()
        .splitlines()[-1]
    )
    if kept is not None:
        kept.parent.mkdir(parents=True, exist_ok=True)
        kept.write_text(cluster_id)
    return cluster_id


def cassandra_command(settings: MintSettings, svc: Service, java: str) -> list[str]:
    jars = resolve_jars("cassandra", settings)
    yaml_path = svc.home / "cassandra.yaml"
    _render(
        "cassandra.yaml.in",
        yaml_path,
        {
            "HOME": str(svc.home),
            "HOST": svc.host,
            # Every node is a seed: any one of them can restart while another is down.
            "SEEDS": ",".join(
                f"{node_host(i)}:{settings.cassandra_storage_port}"
                for i in range(1, settings.dev_nodes + 1)
            ),
            "CQL_PORT": str(svc.port),
            "STORAGE_PORT": str(settings.cassandra_storage_port),
        },
    )
    if svc.node_of_cluster:
        # Tokens chosen here, interleaved across the nodes: nodes that join at once would
        # otherwise compute the same tokens from the same ring and one would own nothing.
        with yaml_path.open("a") as f:
            f.write(f"initial_token: {','.join(map(str, _tokens(svc.node, settings.dev_nodes)))}\n")
    if settings.cassandra_username:  # the secure pair (mint.dev.secure): logins and permissions
        with yaml_path.open("a") as f:
            f.write(
                "\nauthenticator:\n  class_name: PasswordAuthenticator\n"
                "authorizer:\n  class_name: CassandraAuthorizer\n"
                "role_manager:\n  class_name: CassandraRoleManager\n"
            )
    jvm_opts = (SERVICE_CONFIGS / "jvm17.options").read_text().split()
    jamm = sorted(jars.glob("jamm-*.jar"))
    heap = f"{settings.cassandra_heap_mb}m"
    return [
        java,
        f"-Xms{heap}",
        f"-Xmx{heap}",
        "-XX:+UseG1GC",
        *jvm_opts,
        *([f"-javaagent:{jamm[0]}"] if jamm else []),
        f"-Dcassandra.config=file://{yaml_path}",
        # Tests only (MINT_CASSANDRA_FAST_SCHEMA): schema changes skip their flush, so a keyspace
        # migrates in about 2 s instead of 8 (the suite migrates about 60). Schema is read from
        # its tables before the commit log replays, so a kill -9 forgets what was not flushed:
        # never for a node that a test kills (benchmarks/fault_injection.py turns it off).
        *(["-Dcassandra.unsafesystem=true"] if settings.cassandra_fast_schema else []),
        # A fresh local cluster's nodes join empty, side by side: no gossip settling, no
        # one-at-a-time range movements (nothing to stream).
        *(
            [
                "-Dcassandra.skip_wait_for_gossip_to_settle=0",
                "-Dcassandra.consistent.rangemovement=false",
            ]
            if svc.node_of_cluster
            else []
        ),
        "-Dcassandra-foreground=yes",
        f"-Dcassandra.storagedir={svc.home}",
        f"-Dcassandra.logdir={svc.log_file.parent}",
        f"-Dlogback.configurationFile={SERVICE_CONFIGS / 'logback.xml'}",
        "-cp",
        f"{jars}/*",
        "org.apache.cassandra.service.CassandraDaemon",
    ]


def _tokens(node: int, nodes: int, per_node: int = 16) -> list[int]:
    """Node ``node``'s share of ``nodes * per_node`` evenly spaced Murmur3 tokens."""
    total = nodes * per_node
    return [-(2**63) + (j * nodes + node - 1) * (2**64 // total) for j in range(per_node)]
