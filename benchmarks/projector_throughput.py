"""Registration through the projector: export and alias events from Kafka into Cassandra, through
the code path the workers run (``mint worker projector``: the consumer loop, ``apply_event``, the
repository's compare-and-set writes), measured as revisions registered per second.

A backlog of ``--policies`` x ``--revisions`` ``export.completed`` events (in revision order per
policy) is published first; then one projector process starts and drains it; then one
``alias.moved`` per policy (a promotion of its last revision) is published and drained. The rate is registrations per second between the projector's first and last
"revision registered" log lines (start-up is not work). Target (issue 15): >= 1,000
revisions/s. Prints ONE JSON line (``targets`` / ``met``), load average beside the figure, and
where the CPU went while the exports drained: microseconds per revision of the projector
process, and of Cassandra and Kafka when they run on this host (found by their ports; on a
shared machine their figures include other clients' work).

    python benchmarks/projector_throughput.py                    # 500 policies x 10 revisions
    python benchmarks/projector_throughput.py --smoke            # 50 x 4
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks._harness import load_1m, targets_and_met  # noqa: E402

TARGET_REVISIONS_PER_S = 1_000


def backlog(tenant: str, policies: int, revisions: int):
    """(exports, moves): events as the trainer and the controller publish them."""
    from schemas.envelope import make_event
    from schemas.events import AliasMoved, ExportCompleted
    from schemas.examples import example_fields

    exports, moves = [], []
    for p in range(policies):
        policy = f"p{p}"
        for r in range(1, revisions + 1):
            fields = example_fields("export.completed", tenant, policy)
            root = fields["store_uri"].rsplit("/", 1)[0]
            fields.update(
                revision=r,
                adapter_digest=f"sha256:{uuid.uuid4().hex}{uuid.uuid4().hex}",
                store_uri=f"{root}/{r}",
            )
            exports.append(
                make_event(
                    ExportCompleted(**fields),
                    tenant=tenant,
                    policy=policy,
                    producer="bench/trainer",
                )
            )
        last = exports[-1].payload
        moves.append(
            make_event(
                AliasMoved(
                    alias="prod",
                    to_revision=revisions,
                    adapter_digest=last.adapter_digest,
                    store_uri=last.store_uri,
                    cause="promote",
                ),
                tenant=tenant,
                policy=policy,
                producer="bench/controller",
            )
        )
    return exports, moves


def cpu_seconds(procs: dict) -> dict[str, float]:
    out = {}
    for name, proc in procs.items():
        try:
            t = proc.cpu_times()
            out[name] = t.user + t.system
        except Exception:  # noqa: BLE001 - gone or not ours to read: no figure for it
            pass
    return out


def local_servers(settings) -> dict:
    """The Cassandra and Kafka processes listening on this host's configured ports."""
    import psutil

    ports = {
        "cassandra": settings.cassandra_port,
        "kafka": int(settings.kafka_bootstrap.split(",")[0].rsplit(":", 1)[1]),
    }
    found = {}
    for conn in psutil.net_connections(kind="tcp"):
        for name, port in ports.items():
            if conn.status == "LISTEN" and conn.laddr.port == port and conn.pid:
                found[name] = psutil.Process(conn.pid)
    return found


def committed(admin, group: str, topics: set[str]) -> int:
    offsets = admin.list_group_offsets(group).get(group, {})
    return sum(o.offset for tp, o in offsets.items() if tp.topic in topics and o.offset > 0)


def time_rebuild(settings) -> dict:
    """``mint catalog rebuild --compare --drop`` over the benchmark's log and keyspace, as an
    operator runs it (a process of its own): seconds, revisions/s, and whether it matched."""
    env = {
        **os.environ,
        "MINT_TOPIC_PREFIX": settings.topic_prefix,
        "MINT_KEYSPACE": settings.keyspace,
        "MINT_STORE_URI": settings.store_uri,
        "MINT_STATE_DIR": str(settings.state_dir),
    }
    mint = str(Path(sys.executable).parent / "mint")
    t0 = time.perf_counter()
    done = subprocess.run(
        [mint, "catalog", "rebuild", "--compare", "--drop"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=3600,
    )
    seconds = time.perf_counter() - t0
    if done.returncode not in (0, 1):
        raise SystemExit(f"mint catalog rebuild failed ({done.returncode}):\n{done.stdout[-2000:]}")
    return {
        "rebuild_s": round(seconds, 1),
        "rebuild_equal_to_live": done.returncode == 0,
        "rebuild_load_avg_1m": load_1m(),
        "rebuild_output": done.stdout.strip().splitlines()[-4:],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--policies", type=int, default=500)
    ap.add_argument("--revisions", type=int, default=10, help="per policy")
    ap.add_argument("--smoke", action="store_true", help="50 policies x 4 revisions")
    ap.add_argument("--timeout", type=float, default=900.0)
    ap.add_argument("--parallel", type=int, default=16, help="the projector's --parallel")
    ap.add_argument(
        "--rebuild",
        action="store_true",
        help="then time `mint catalog rebuild --compare --drop` of the whole log (issue 28: "
        "100,000 revisions with --policies 1000 --revisions 100)",
    )
    args = ap.parse_args()
    if args.smoke:
        args.policies, args.revisions = 50, 4

    from kafka.errors import KafkaError

    from catalog.cluster import connect
    from mint.dev.workers import Workers
    from schemas.logs import configure_logging
    from schemas.settings import MintSettings
    from streams import EventProducer, ensure_topics
    from streams.clients import make_admin
    from workers.projector.main import PROJECTOR_GROUP

    configure_logging("WARNING", "console")
    tag = uuid.uuid4().hex[:8]
    work = Path(tempfile.mkdtemp(prefix="projector-bench-"))
    settings = MintSettings(
        topic_prefix=f"bproj{tag}",
        keyspace=f"bench_proj_{tag}",
        state_dir=work / "state",
        store_uri=str(work / "store"),
    )
    ensure_topics(settings)
    exports, moves = backlog("bench", args.policies, args.revisions)
    t0 = time.perf_counter()
    with EventProducer(settings) as producer:
        producer.publish_many(exports)
    publish_s = time.perf_counter() - t0
    topics = {settings.topic("export.events"), settings.topic("serving.events")}
    group = f"{settings.topic_prefix}-{PROJECTOR_GROUP}"

    workers = Workers(settings, ROOT, work / "logs")
    admin = make_admin(settings)
    cpu: dict[str, dict[str, float]] = {}  # "first" (the group is there) and "last" readings
    first_at: list[float] = []

    def drain(total: int, procs: dict | None = None) -> None:
        deadline = time.monotonic() + args.timeout
        done = 0
        while done < total:
            if time.monotonic() > deadline:
                raise SystemExit(f"projector applied {done} of {total} in {args.timeout} s")
            if workers.procs["projector"].poll() is not None:
                raise SystemExit(f"projector exited; see {work / 'logs' / 'projector.log'}")
            try:
                done = committed(admin, group, topics)
            except KafkaError:  # the group does not exist until the first join
                done = 0
            else:
                if procs is not None and "first" not in cpu:  # joined: start-up is over
                    cpu["first"] = cpu_seconds(procs)
                    first_at.append(time.time())
            time.sleep(0.05)
        if procs is not None:
            cpu["last"] = cpu_seconds(procs)

    try:
        import psutil

        proc = workers.start(
            "projector", "projector", "--migrate", "--parallel", str(args.parallel)
        )
        drain(len(exports), {"projector": psutil.Process(proc.pid), **local_servers(settings)})
        load = os.getloadavg()[0]
        # Promotions come after their revisions were registered (the controller moves an alias
        # to an evaluated revision), so they are published once the exports are in.
        with EventProducer(settings) as producer:
            producer.publish_many(moves)
        drain(len(exports) + len(moves))
    finally:
        admin.close()
        workers.stop_all()

    rebuilt = time_rebuild(settings) if args.rebuild else {}
    cluster, session = connect(settings)
    try:
        rows = session.execute(f"SELECT count(*) FROM {settings.keyspace}.revisions").one()[0]
        aliases = session.execute(f"SELECT count(*) FROM {settings.keyspace}.aliases").one()[0]
        session.execute(f"DROP KEYSPACE IF EXISTS {settings.keyspace}", timeout=120)
    finally:
        cluster.shutdown()
    # The projector logs each registration as it happens: its time from the first to the last.
    stamps = [
        datetime.fromisoformat(json.loads(line)["timestamp"].replace("Z", "+00:00"))
        for line in (work / "logs" / "projector.log").read_text().splitlines()
        if '"revision registered"' in line
    ]
    seconds = (stamps[-1] - stamps[0]).total_seconds() if len(stamps) > 1 else float("nan")
    rate = (len(stamps) - 1) / seconds if seconds > 0 else 0.0
    # Revisions registered between the two CPU readings (group joined .. all committed).
    since_first = [s for s in stamps if first_at and s.timestamp() >= first_at[0]]
    first, last = cpu.get("first", {}), cpu.get("last", {})
    cpu_us = {
        name: round((last[name] - first[name]) / max(len(since_first), 1) * 1e6)
        for name in first
        if name in last
    }
    out = {
        "benchmark": "projector_throughput",
        "smoke": args.smoke,
        "policies": args.policies,
        "revisions_per_policy": args.revisions,
        "events": len(exports) + len(moves),
        "parallel": args.parallel,
        "revisions_registered": rows,
        "aliases": aliases,
        "publish_s": round(publish_s, 2),
        "drain_s": round(seconds, 2),
        "revisions_per_s": round(rate, 1),
        "load_avg_1m": round(load, 2),
        "cpu_us_per_revision": cpu_us,
        **rebuilt,
        **({"rebuild_revisions_per_s": round(rows / rebuilt["rebuild_s"], 1)} if rebuilt else {}),
        **targets_and_met(
            revisions_per_s=(rate, ">=", TARGET_REVISIONS_PER_S),
            # the catalog is a projection of the log: a rebuild must equal the live catalog
            **(
                {"rebuild_equal_to_live": (rebuilt["rebuild_equal_to_live"], ">=", True)}
                if rebuilt
                else {}
            ),
        ),
        "note": "one projector process draining a backlog; rate between its first and last "
        "registration",
    }
    assert rows == len(exports) and aliases == args.policies, (rows, aliases)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
