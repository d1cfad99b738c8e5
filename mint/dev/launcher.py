"""Local Kafka (KRaft) and Cassandra as plain JVM processes: one node each (``mint dev up``), or
a local cluster of three of each on 127.0.0.1-3 (``MINT_DEV_NODES=3`` / ``mint dev up --nodes 3``).

Data, logs and pid files live under ``settings.state_dir`` (a cluster's under ``cluster/``).
``up`` is idempotent and waits for readiness; ``down`` stops only processes whose pid file this
launcher wrote (and whose command line still names their state folder, so a recycled pid is
never signalled); ``kill`` and ``up(only=(node,))`` are the drills of ``mint dev kill|start``.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import structlog

from mint.dev.jvm import LauncherError, Service, cassandra_command, java_binary, kafka_command
from schemas.settings import LOCAL_NODES, MintSettings

log = structlog.get_logger()
KINDS = ("kafka", "cassandra")

__all__ = [
    "LauncherError",
    "Service",
    "ServiceStatus",
    "down",
    "kill",
    "services",
    "status",
    "stop",
    "up",
]


@dataclass(frozen=True)
class ServiceStatus:
    name: str
    mode: str  # "managed" | "external"
    address: str
    answering: bool
    pid: int | None
    rss_mb: float | None


def services(settings: MintSettings, nodes: int | None = None) -> dict[str, Service]:
    """The managed services by name, Kafka's first: ``nodes`` (default MINT_DEV_NODES) of each."""
    nodes = nodes or settings.dev_nodes
    state = settings.state_dir
    ports = {
        "kafka": int(settings.kafka_bootstrap.split(",")[0].rpartition(":")[2]),
        "cassandra": settings.cassandra_port,
    }
    logs = {"kafka": "server.log", "cassandra": "system.log"}
    out = {}
    for kind in KINDS:
        for i in range(1, nodes + 1):
            name = kind if nodes == 1 else f"{kind}-{i}"
            home = state / kind if nodes == 1 else state / "cluster" / name
            out[name] = Service(name, kind, i, ports[kind], home, home / "logs" / logs[kind])
    return out


def _named(settings: MintSettings, only: tuple[str, ...]) -> list[Service]:
    """The services ``only`` names: kinds (every node of it) or node names (``kafka-2``)."""
    svcs = services(settings)
    unknown = [n for n in only if n not in KINDS and n not in svcs]
    if unknown:
        raise LauncherError(
            f"no service named {', '.join(unknown)}: choose from {', '.join((*KINDS, *svcs))}"
            + ("" if settings.dev_nodes > 1 else " (a cluster's nodes need MINT_DEV_NODES=3)")
        )
    return [s for s in svcs.values() if s.kind in only or s.name in only]


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
    return f"{svc.home}/" in cmdline or cmdline.rstrip().endswith(str(svc.home))


def _rss_mb(pid: int) -> float | None:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    m = re.search(r"VmRSS:\s+(\d+) kB", status)
    return int(m.group(1)) / 1024 if m else None


# ---------------------------------------------------------------- verbs


def _external(settings: MintSettings, kind: str) -> bool:
    return settings.kafka_is_external if kind == "kafka" else settings.cassandra_is_external


def up(settings: MintSettings, only: tuple[str, ...] = KINDS) -> dict[str, float]:
    """Start what is not running, wait until every service answers; returns seconds to ready.

    ``only``: kinds or node names. A cluster's brokers start together (their quorum needs a
    majority); its Cassandra nodes start after the first one answers, so that a fresh cluster
    forms around one node rather than three clusters forming at once."""
    if settings.dev_nodes > 1 and settings.kafka_secure:
        raise LauncherError("the secure pair runs one node of each: unset MINT_DEV_NODES")
    other = services(settings, 1 if settings.dev_nodes > 1 else LOCAL_NODES)
    running = [svc.name for svc in other.values() if _read_pid(svc) is not None]
    if running:  # the same ports on 127.0.0.1: the other layout would answer in this one's place
        raise LauncherError(
            f"{', '.join(running)} already run{'s' if len(running) == 1 else ''} under "
            f"{settings.state_dir} with MINT_DEV_NODES="
            f"{'1' if settings.dev_nodes > 1 else 'N'}: stop them first with `mint dev down`"
        )
    chosen = [s for s in _named(settings, only) if not _external(settings, s.kind)]
    started: dict[str, subprocess.Popen] = {}
    t0 = time.monotonic()
    deadline = t0 + settings.startup_timeout_s * max(1, settings.dev_nodes / 2)
    first_cassandra = [s for s in chosen if s.kind == "cassandra"][:1]
    fresh = first_cassandra and not (first_cassandra[0].home / "data").exists()
    ready: dict[str, float] = {}
    try:
        for svc in chosen:
            _start(settings, svc, started)
            if fresh and svc in first_cassandra and settings.dev_nodes > 1:
                _wait(svc, started, deadline, settings)
        for svc in chosen:
            _wait(svc, started, deadline, settings)
            if svc.name in started:
                ready[svc.name] = time.monotonic() - t0
                log.info("service ready", service=svc.name, seconds=round(ready[svc.name], 1))
    except BaseException:
        # half up is neither: stop what this call started (the error says why it failed)
        for svc in chosen:
            if svc.name in started:
                _stop(svc, timeout_s=30.0)
        raise
    return ready


def _start(settings: MintSettings, svc: Service, started: dict[str, subprocess.Popen]) -> None:
    if _read_pid(svc) is not None or port_open(svc.host, svc.port):
        return  # idempotent: ours already running, or something already answers there
    command = kafka_command if svc.kind == "kafka" else cassandra_command
    cmd = command(settings, svc, java_binary())
    svc.log_file.parent.mkdir(parents=True, exist_ok=True)
    with open(svc.home / f"{svc.kind}.out", "ab") as out:
        proc = subprocess.Popen(
            cmd,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    svc.pid_file.write_text(str(proc.pid))
    started[svc.name] = proc
    log.info("service starting", service=svc.name, pid=proc.pid, address=f"{svc.host}:{svc.port}")


def _wait(
    svc: Service, started: dict[str, subprocess.Popen], deadline: float, settings: MintSettings
) -> None:
    while not port_open(svc.host, svc.port):
        # Our own child: poll it rather than /proc, whose cmdline can read empty while the
        # JVM launcher re-execs itself.
        if svc.name in started and started[svc.name].poll() is not None:
            raise LauncherError(_failure(svc, "exited during start"))
        if time.monotonic() > deadline:
            raise LauncherError(
                _failure(svc, f"did not answer within {settings.startup_timeout_s:.0f} s")
            )
        time.sleep(0.25)


def _failure(svc: Service, what: str) -> str:
    tail = ""
    out_file = svc.home / f"{svc.kind}.out"
    for path in (out_file, svc.log_file):
        if path.exists():
            tail = "\n".join(path.read_text(errors="replace").splitlines()[-15:])
            if tail:
                break
    return (
        f"{svc.name} {what} (port {svc.port} on {svc.host}); read {svc.log_file} and {out_file}. "
        f"Last lines:\n{tail}"
    )


def kill(settings: MintSettings, name: str, timeout_s: float = 30.0) -> int | None:
    """SIGKILL one managed service or node, as a crash would (chaos runs and drills:
    benchmarks/fault_injection.py, ``mint dev kill``), and wait until its port is closed; ``up``
    starts it again on the same data. Returns its pid (None: it was not running here)."""
    svc = _one(settings, name)
    pid = _read_pid(svc)
    if pid is None:
        return None
    os.killpg(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout_s
    while port_open(svc.host, svc.port) and time.monotonic() < deadline:
        time.sleep(0.1)
    svc.pid_file.unlink(missing_ok=True)
    log.warning("service killed", service=name, pid=pid)
    return pid


def _one(settings: MintSettings, name: str) -> Service:
    svcs = services(settings)
    if name not in svcs:
        raise LauncherError(f"no node named {name!r}: choose from {', '.join(svcs)}")
    return svcs[name]


def down(settings: MintSettings, timeout_s: float = 60.0) -> list[str]:
    """Stop every service this launcher started under the state folder, one node or a
    cluster's (whatever MINT_DEV_NODES says now): SIGTERM, then SIGKILL after ``timeout_s``."""
    known = {**services(settings, 1), **services(settings, LOCAL_NODES)}
    # All at once: the last broker of a quorum stopped alone waits for a majority that is gone
    # (it ignored SIGTERM for the whole minute); together they all go within seconds.
    with ThreadPoolExecutor(max_workers=len(known)) as pool:
        stopped = pool.map(lambda svc: _stop(svc, timeout_s), known.values())
        return [svc.name for svc, was in zip(known.values(), stopped, strict=True) if was]


def stop(settings: MintSettings, name: str, timeout_s: float = 60.0) -> bool:
    """Stop one node cleanly (SIGTERM: a broker hands its leaderships over first), as a
    rolling restart does; False when it was not running here."""
    return _stop(_one(settings, name), timeout_s)


def _stop(svc: Service, timeout_s: float) -> bool:
    pid = _read_pid(svc)
    if pid is None:
        if svc.home.exists():
            svc.pid_file.unlink(missing_ok=True)
        return False
    os.killpg(pid, signal.SIGTERM)  # the JVM leads its own session (start_new_session)
    deadline = time.monotonic() + timeout_s
    while _is_ours(pid, svc) and time.monotonic() < deadline:
        time.sleep(0.2)
    if _is_ours(pid, svc):
        log.warning("service ignored SIGTERM, killing", service=svc.name, pid=pid)
        os.killpg(pid, signal.SIGKILL)
    svc.pid_file.unlink(missing_ok=True)
    log.info("service stopped", service=svc.name, pid=pid)
    return True


def status(settings: MintSettings) -> list[ServiceStatus]:
    """Each managed node, or each external cluster's first contact point."""
    result = []
    kafka_host, _, kafka_port = settings.kafka_bootstrap.split(",")[0].rpartition(":")
    external_at = {
        "kafka": (kafka_host, int(kafka_port)),
        "cassandra": (settings.cassandra_contact_points[0], settings.cassandra_port),
    }
    for svc in services(settings).values():
        if _external(settings, svc.kind):
            if svc.node > 1:
                continue
            host, port = external_at[svc.kind]
            pid = None
        else:
            host, port, pid = svc.host, svc.port, _read_pid(svc)
        result.append(
            ServiceStatus(
                name=svc.kind if _external(settings, svc.kind) else svc.name,
                mode="external" if _external(settings, svc.kind) else "managed",
                address=f"{host}:{port}",
                answering=port_open(host, port, timeout=2.0),
                pid=pid,
                rss_mb=_rss_mb(pid) if pid else None,
            )
        )
    return result
