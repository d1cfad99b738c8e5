"""Local Kafka (KRaft, one node) and Cassandra (one node) as plain JVM processes.

Data, logs and pid files live under ``settings.state_dir``. ``up`` is idempotent and waits for
readiness; ``down`` stops only processes whose pid file this launcher wrote (and whose command line
still names our state folder, so a recycled pid is never signalled).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import structlog

from schemas.exceptions import MintError
from schemas.settings import PROJECT_ROOT, MintSettings

log = structlog.get_logger()

# The services' config templates ship inside the package (an installed wheel has them too).
SERVICE_CONFIGS = Path(__file__).resolve().parent / "services"
# The jars vendored beside a checkout (../shared/vendor/jvm); an installed MinT has none there
# and uses MINT_KAFKA_JARS / MINT_CASSANDRA_JARS or a Maven-fetched copy under MINT_HOME.
VENDORED_JVM = PROJECT_ROOT.parent / "shared" / "vendor" / "jvm"


class LauncherError(MintError, RuntimeError):
    """A local service could not be prepared, started or stopped; the message says what to do."""


@dataclass(frozen=True)
class Service:
    name: str  # "kafka" | "cassandra"
    port: int
    home: Path  # state folder of this service
    log_file: Path

    @property
    def pid_file(self) -> Path:
        return self.home / f"{self.name}.pid"


@dataclass(frozen=True)
class ServiceStatus:
    name: str
    mode: str  # "managed" | "external"
    address: str
    answering: bool
    pid: int | None
    rss_mb: float | None


def services(settings: MintSettings) -> dict[str, Service]:
    state = settings.state_dir
    kafka_port = int(settings.kafka_bootstrap.split(",")[0].rpartition(":")[2])
    return {
        "kafka": Service(
            "kafka", kafka_port, state / "kafka", state / "kafka" / "logs" / "server.log"
        ),
        "cassandra": Service(
            "cassandra",
            settings.cassandra_port,
            state / "cassandra",
            state / "cassandra" / "logs" / "system.log",
        ),
    }


# ---------------------------------------------------------------- processes and ports


def port_open(host: str, port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def _read_pid(svc: Service) -> int | None:
    try:
        pid = int(svc.pid_file.read_text().strip())
    except (FileNotFoundError, ValueError):
        return None
    return pid if _is_ours(pid, svc) else None


def _is_ours(pid: int, svc: Service) -> bool:
    """The pid is alive and its command line names this service's state folder."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return False
    return str(svc.home) in cmdline


def _rss_mb(pid: int) -> float | None:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    m = re.search(r"VmRSS:\s+(\d+) kB", status)
    return int(m.group(1)) / 1024 if m else None


# ---------------------------------------------------------------- jars and java


def _java() -> str:
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
    for candidate in (VENDORED_JVM / name, settings.state_dir / "jars" / name):
        if any(candidate.glob("*.jar")):
            return candidate
    return _maven_fetch(name, settings.state_dir / "jars" / name)


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


def _kafka_command(settings: MintSettings, svc: Service, java: str) -> list[str]:
    jars = resolve_jars("kafka", settings)
    props = svc.home / "server.properties"
    values = {
        "STATE": str(svc.home),
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
    if settings.kafka_secure:
        os.chmod(props, 0o600)  # it holds the broker's own password
    common = [
        "-cp",
        f"{jars}/*",
        f"-Dlog4j2.configurationFile={SERVICE_CONFIGS / 'log4j2.xml'}",
        f"-Dkafka.logs.dir={svc.log_file.parent}",
    ]
    if not (svc.home / "kafka-data" / "meta.properties").exists():
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
        fmt = subprocess.run(
            [
                java,
                *common,
                "kafka.tools.StorageTool",
                "format",
                "--standalone",
                "-t",
                cluster_id,
                "-c",
                str(props),
                *scram,
            ],
            capture_output=True,
            text=True,
        )
        if fmt.returncode != 0:
            raise LauncherError(f"kafka storage format failed:\n{fmt.stdout}{fmt.stderr}")
    heap = f"{settings.kafka_heap_mb}m"
    return [java, f"-Xms{heap}", f"-Xmx{heap}", *common, "kafka.Kafka", str(props)]


def _cassandra_command(settings: MintSettings, svc: Service, java: str) -> list[str]:
    jars = resolve_jars("cassandra", settings)
    yaml_path = svc.home / "cassandra.yaml"
    _render(
        "cassandra.yaml.in",
        yaml_path,
        {
            # The template's paths are @STATE@/cassandra/...; our service home already ends in cassandra.
            "STATE": str(svc.home.parent),
            "CQL_PORT": str(svc.port),
            "STORAGE_PORT": str(settings.cassandra_storage_port),
        },
    )
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
        "-Dcassandra-foreground=yes",
        f"-Dcassandra.storagedir={svc.home}",
        f"-Dcassandra.logdir={svc.log_file.parent}",
        f"-Dlogback.configurationFile={SERVICE_CONFIGS / 'logback.xml'}",
        "-cp",
        f"{jars}/*",
        "org.apache.cassandra.service.CassandraDaemon",
    ]


# ---------------------------------------------------------------- verbs


def _external(settings: MintSettings, name: str) -> bool:
    return settings.kafka_is_external if name == "kafka" else settings.cassandra_is_external


def up(settings: MintSettings, only: tuple[str, ...] = ("kafka", "cassandra")) -> dict[str, float]:
    """Start what is not running, wait until every service answers; returns seconds to ready."""
    svcs = services(settings)
    started: dict[str, subprocess.Popen] = {}
    java = None
    t0 = time.monotonic()
    for name in only:
        svc = svcs[name]
        if _external(settings, name):
            continue
        if _read_pid(svc) is not None or port_open("127.0.0.1", svc.port):
            continue  # idempotent: ours already running, or something already answers there
        java = java or _java()
        svc.log_file.parent.mkdir(parents=True, exist_ok=True)
        cmd = (_kafka_command if name == "kafka" else _cassandra_command)(settings, svc, java)
        with open(svc.home / f"{name}.out", "ab") as out:
            proc = subprocess.Popen(
                cmd,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        svc.pid_file.write_text(str(proc.pid))
        started[name] = proc
        log.info("service starting", service=name, pid=proc.pid, port=svc.port)
    ready: dict[str, float] = {}
    for name in only:
        svc = svcs[name]
        host = "127.0.0.1"
        if _external(settings, name):
            continue
        deadline = t0 + settings.startup_timeout_s
        while not port_open(host, svc.port):
            # Our own child: poll it rather than /proc, whose cmdline can read empty while the
            # JVM launcher re-execs itself.
            if name in started and started[name].poll() is not None:
                raise LauncherError(_failure(svc, "exited during start"))
            if time.monotonic() > deadline:
                raise LauncherError(
                    _failure(svc, f"did not answer within {settings.startup_timeout_s:.0f} s")
                )
            time.sleep(0.25)
        if name in started:
            ready[name] = time.monotonic() - t0
            log.info("service ready", service=name, port=svc.port, seconds=round(ready[name], 1))
    return ready


def _failure(svc: Service, what: str) -> str:
    tail = ""
    for path in (svc.home / f"{svc.name}.out", svc.log_file):
        if path.exists():
            tail = "\n".join(path.read_text(errors="replace").splitlines()[-15:])
            if tail:
                break
    return (
        f"{svc.name} {what} (port {svc.port}); read {svc.log_file} and "
        f"{svc.home / (svc.name + '.out')}. Last lines:\n{tail}"
    )


def kill(settings: MintSettings, name: str, timeout_s: float = 30.0) -> int | None:
    """SIGKILL one managed service, as a crash would (chaos runs: benchmarks/fault_injection.py),
    and wait until its port is closed; ``up`` starts it again on the same data. Returns its pid
    (None: it was not running under this launcher)."""
    svc = services(settings)[name]
    pid = _read_pid(svc)
    if pid is None:
        return None
    os.killpg(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout_s
    while port_open("127.0.0.1", svc.port) and time.monotonic() < deadline:
        time.sleep(0.1)
    svc.pid_file.unlink(missing_ok=True)
    log.warning("service killed", service=name, pid=pid)
    return pid


def down(settings: MintSettings, timeout_s: float = 60.0) -> list[str]:
    """Stop the services this launcher started (SIGTERM, then SIGKILL after ``timeout_s``)."""
    stopped = []
    for svc in services(settings).values():
        pid = _read_pid(svc)
        if pid is None:
            svc.pid_file.unlink(missing_ok=True)
            continue
        os.killpg(pid, signal.SIGTERM)  # the JVM leads its own session (start_new_session)
        deadline = time.monotonic() + timeout_s
        while _is_ours(pid, svc) and time.monotonic() < deadline:
            time.sleep(0.2)
        if _is_ours(pid, svc):
            log.warning("service ignored SIGTERM, killing", service=svc.name, pid=pid)
            os.killpg(pid, signal.SIGKILL)
        svc.pid_file.unlink(missing_ok=True)
        stopped.append(svc.name)
        log.info("service stopped", service=svc.name, pid=pid)
    return stopped


def status(settings: MintSettings) -> list[ServiceStatus]:
    result = []
    kafka_host, _, kafka_port = settings.kafka_bootstrap.split(",")[0].rpartition(":")
    addresses = {
        "kafka": (kafka_host, int(kafka_port)),
        "cassandra": (settings.cassandra_contact_points[0], settings.cassandra_port),
    }
    for name, svc in services(settings).items():
        host, port = addresses[name]
        external = _external(settings, name)
        pid = None if external else _read_pid(svc)
        result.append(
            ServiceStatus(
                name=name,
                mode="external" if external else "managed",
                address=f"{host}:{port}",
                answering=port_open(host, port, timeout=2.0),
                pid=pid,
                rss_mb=_rss_mb(pid) if pid else None,
            )
        )
    return result
