"""Registration through the projector: export and alias events from Kafka into Cassandra, through
the code path the workers run (``mint worker projector``: the consumer loop, ``apply_event``, the
repository's compare-and-set writes), measured as revisions registered per second.

A backlog of ``--policies`` x ``--revisions`` ``export.completed`` events (in revision order per
policy) is published first; then one projector process starts and drains it; then one
``alias.moved`` per policy (a promotion of its last revision) is published and drained. The rate is registrations per second between the projector's first and last
"revision registered" log lines (start-up is not work). Target (issue 15): >= 1,000
revisions/s. Prints ONE JSON line (``targets`` / ``met``), load average beside the figure.

    python benchmarks/projector_throughput.py                    # 500 policies x 10 revisions
    python benchmarks/projector_throughput.py --smoke            # 50 x 4
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import uuid
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

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
            fields.update(revision=r, adapter_digest=f"sha256:{uuid.uuid4().hex}{uuid.uuid4().hex}",
                          store_uri=f"{root}/{r}")  # fmt: skip
            exports.append(make_event(ExportCompleted(**fields), tenant=tenant, policy=policy,
                                      producer="bench/trainer"))  # fmt: skip
        last = exports[-1].payload
        moves.append(make_event(AliasMoved(alias="prod", to_revision=revisions,
                                           adapter_digest=last.adapter_digest,
                                           store_uri=last.store_uri, cause="promote"),
                                tenant=tenant, policy=policy, producer="bench/controller"))  # fmt: skip
    return exports, moves


def committed(admin, group: str, topics: set[str]) -> int:
    offsets = admin.list_group_offsets(group).get(group, {})
    return sum(o.offset for tp, o in offsets.items() if tp.topic in topics and o.offset > 0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--policies", type=int, default=500)
    ap.add_argument("--revisions", type=int, default=10, help="per policy")
    ap.add_argument("--smoke", action="store_true", help="50 policies x 4 revisions")
    ap.add_argument("--timeout", type=float, default=900.0)
    ap.add_argument("--parallel", type=int, default=16, help="the projector's --parallel")
    args = ap.parse_args()
    if args.smoke:
        args.policies, args.revisions = 50, 4

    from kafka.errors import KafkaError

    from catalog.cluster import connect
    from mint.demo import Workers
    from schemas.logs import configure_logging
    from schemas.settings import MintSettings
    from streams import EventProducer, ensure_topics
    from streams.clients import make_admin
    from workers.projector.main import PROJECTOR_GROUP

    configure_logging("WARNING", "console")
    tag = uuid.uuid4().hex[:8]
    work = Path(tempfile.mkdtemp(prefix="projector-bench-"))
    settings = MintSettings(topic_prefix=f"bproj{tag}", keyspace=f"bench_proj_{tag}",
                            state_dir=work / "state", store_uri=str(work / "store"))  # fmt: skip
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

    def drain(total: int) -> None:
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
            time.sleep(0.05)

    try:
        workers.start("projector", "projector", "--migrate", "--parallel", str(args.parallel))
        drain(len(exports))
        load = os.getloadavg()[0]
        # Promotions come after their revisions were registered (the controller moves an alias
        # to an evaluated revision), so they are published once the exports are in.
        with EventProducer(settings) as producer:
            producer.publish_many(moves)
        drain(len(exports) + len(moves))
    finally:
        admin.close()
        workers.stop_all()

    cluster, session = connect(settings)
    try:
        rows = session.execute(f"SELECT count(*) FROM {settings.keyspace}.revisions").one()[0]
        aliases = session.execute(f"SELECT count(*) FROM {settings.keyspace}.aliases").one()[0]
        session.execute(f"DROP KEYSPACE IF EXISTS {settings.keyspace}", timeout=120)
    finally:
        cluster.shutdown()
    # The projector logs each registration as it happens: its time from the first to the last.
    stamps = [datetime.fromisoformat(json.loads(line)["timestamp"].replace("Z", "+00:00"))
              for line in (work / "logs" / "projector.log").read_text().splitlines()
              if '"revision registered"' in line]  # fmt: skip
    seconds = (stamps[-1] - stamps[0]).total_seconds() if len(stamps) > 1 else float("nan")
    rate = (len(stamps) - 1) / seconds if seconds > 0 else 0.0
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
        "targets": {"revisions_per_s": TARGET_REVISIONS_PER_S},
        "met": {"revisions_per_s": rate >= TARGET_REVISIONS_PER_S},
        "note": "one projector process draining a backlog; rate between its first and last "
        "registration",
    }
    assert rows == len(exports) and aliases == args.policies, (rows, aliases)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
