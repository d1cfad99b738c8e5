"""Fault injection: the whole lifecycle under steady traffic while its parts are killed -9.

Its own Kafka and Cassandra (other ports, a temporary state folder: the faults disturb nothing
else), the demo's workers (projector, controller, trainer, one vLLM engine host) on the tiny
Llama, and the SDK. Inference requests flow all the time, every 0.25 s (an upstream producer
that resends until the broker confirms). Each fault is one round: a training update is started,
then the part is killed -9 while the update runs and restarted a few seconds later; the round
ends when the update's revision was exported and a request sent after the restart was answered
(``recovery_seconds``), then the revision is promoted and, every other round, rolled back.

At the end every request must have its answer, every update exactly one revision, the
dead-letter topic stays empty (all traffic is valid: a dead letter here is a transient failure
that was dead-lettered), and the catalog equals a replay of the log. ONE JSON line:

    python benchmarks/fault_injection.py           # kafka, cassandra, then each worker kind
    python benchmarks/fault_injection.py --smoke   # one fault of each kind: kafka, cassandra,
                                                   # the trainer (what the tests run)
    python benchmarks/fault_injection.py --faults engine,controller --down-s 5
    python benchmarks/fault_injection.py --cluster          # three brokers and three Cassandra
                                                            # nodes: kill -9 one of each, then
                                                            # a rolling restart of each kind
    python benchmarks/fault_injection.py --cluster --smoke  # one broker, one node killed

With ``--cluster`` (benchmarks/_fault_cluster.py) the figures gain ``longest_answer_gap_s`` per
fault: the longest time the steady traffic went without an answer, target at most 5 s (a node
down is not an outage); one node each it is the outage itself.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import _fault_cluster  # noqa: E402
from benchmarks._fault_traffic import POLICY, Traffic, answered, dead_letters, watched  # noqa: E402

SERVICES = ("kafka", "cassandra")
WORKERS = ("projector", "controller", "trainer", "engine")
FULL = SERVICES + WORKERS
SMOKE = ("kafka", "cassandra", "trainer")
# What must hold after every fault (each figure equals its target).
TARGETS = {
    "lost": 0,
    "duplicate_revisions": 0,
    "transient_dead_letters": 0,
    "catalog_equals_replay": True,
    "requests_unanswered": 0,
}


def inject(fault: str, settings, workers, down_s: float, killed: list[str]):
    """Kill ``fault`` and bring it back; a cluster node comes back in the thread returned (the
    node killed is added to ``killed``)."""
    from mint.dev import launcher

    if fault in _fault_cluster.CLUSTER_FAULTS:
        return _fault_cluster.inject(fault, settings, down_s, killed)
    if fault in SERVICES:
        launcher.kill(settings, fault)
        time.sleep(down_s)
        launcher.up(settings, only=(fault,))
    else:
        workers.stop(fault, sig=signal.SIGKILL)
        time.sleep(down_s)
        workers.start_worker(fault)
    return None


def run(
    faults: tuple[str, ...],
    down_s: float,
    steps: int,
    smoke: bool,
    keep: bool,
    secure: bool = False,
    cluster: bool = False,
) -> dict:
    from catalog.claims import write_jsonl
    from catalog.cluster import connect
    from catalog.migrate import migrate
    from catalog.rebuild import replay_differences
    from mint.demo import PROMPTS, TENANT
    from mint.dev import launcher
    from mint.dev.workers import Workers, tiny_model, wait_projected
    from mint.sdk import MintClient, rollouts_to_examples
    from schemas.events import LoraSpec, UpdateRequested
    from schemas.settings import MintSettings
    from streams.topics import ensure_topics
    from workers.projector import read_log

    run_id = uuid.uuid4().hex[:6]
    killed: list[str] = []  # the cluster nodes the node faults killed, in order
    state = Path(tempfile.mkdtemp(prefix="mint-fault-"))
    s = MintSettings().model_copy(
        update={
            "topic_prefix": f"chaos-{run_id}",
            "keyspace": f"chaos_{run_id}",
            "state_dir": state,
            "kafka_bootstrap": "127.0.0.1:29092",
            "kafka_controller_port": 29093,
            "cassandra_port": 29042,
            "cassandra_storage_port": 27000,
            "store_uri": str(state / "store"),
            "models_dir": state / "models",
            # its Cassandra is killed -9: every schema change must be on disk before that
            "cassandra_fast_schema": False,
        }
    )
    if cluster:
        ports = {"kafka": 29092, "controller": 29093, "cql": 29042, "storage": 27000}
        s = _fault_cluster.cluster_settings(s, ports)
    admin = s
    if secure:  # credentials and ACLs on; the SDK runs as `operator`, each worker as itself
        from mint.dev.secure import secure_settings, setup

        admin, s = secure_settings(s, "admin"), secure_settings(s, "operator")
    targets: dict = dict(TARGETS)
    if cluster:
        targets["longest_answer_gap_s"] = f"<= {_fault_cluster.GAP_TARGET_S} per fault"
    t0 = time.monotonic()
    out: dict = {
        "benchmark": "fault_injection",
        "smoke": smoke,
        "faults": list(faults),
        "down_s": down_s,
        "secure": secure,
        "cluster": cluster,
    }
    workers = client = traffic = clock = None
    try:
        out["services_ready_s"] = {k: round(v, 1) for k, v in launcher.up(admin).items()}
        if secure:
            setup(admin)
        ensure_topics(admin)
        db, session = connect(admin)
        migrate(session, s.keyspace, s.keyspace_replication)
        model = tiny_model(s)
        workers = Workers(s, model, state / "logs")
        workers.start_all()
        client = MintClient(s, TENANT, producer="chaos", timeout_s=600)
        client.base_models[POLICY] = str(model)
        lora = LoraSpec(rank=8, alpha=16, target_modules=["q_proj", "v_proj"])
        latest = client.init_policy(POLICY, lora=lora).revision
        client.promote(POLICY, latest, reason="baseline")
        ro = client.rollout(
            POLICY,
            PROMPTS,
            revision=latest,
            reward="even_tokens",
            samples_per_prompt=4,
            max_tokens=8,
            seed=1,
        )
        data = write_jsonl(
            client.store, TENANT, POLICY, "data", "chaos", rollouts_to_examples(ro.rows)
        )
        updates = 1  # init_policy's
        clock = _fault_cluster.AnswerClock(client)
        clock.start()
        traffic = Traffic(client)
        traffic.start()
        gaps: dict[str, float] = {}
        recovery: dict[str, float] = {}
        breakdown: dict[str, dict[str, float]] = {}
        for i, fault in enumerate(faults):
            # a fault named more than once (--faults kafka-node,kafka-node) is kept per round
            key = fault if faults.count(fault) == 1 else f"{fault}#{faults[: i + 1].count(fault)}"
            cmd = client.send(
                POLICY,
                UpdateRequested(
                    base_model=str(model),
                    parent_revision=latest,
                    objective="rl",
                    data_uri=data,
                    steps=steps,
                    batch_size=len(ro.rows),
                    learning_rate=1e-2,
                    lora=lora,
                ),
            )
            time.sleep(1.0)  # the update is running (or queued behind the trainer's poll)
            t_kill = time.monotonic()
            print(f"fault {i + 1}/{len(faults)}: kill -9 {fault}", file=sys.stderr, flush=True)
            restart = inject(fault, admin, workers, down_s, killed)
            probe = f"probe-{fault}-{i}"
            traffic.send(probe, PROMPTS[0])
            export = watched(
                workers,
                lambda timeout_s, c=cmd: client.wait_caused_by(
                    c, "export.completed", timeout_s=timeout_s
                ),
            )
            exported_s = time.monotonic() - t_kill
            watched(
                workers,
                lambda timeout_s, p=probe: client.wait_for(
                    lambda e: (
                        e.type in ("infer.completed", "infer.failed") and e.payload.request_id == p
                    ),
                    timeout_s=timeout_s,
                    what=f"the answer to {p}",
                ),
            )
            recovery[key] = round(time.monotonic() - t_kill, 1)
            if restart is not None:  # a cluster node: back before the round's end
                restart.join()
            gaps[key] = clock.longest_gap(t_kill, time.monotonic())
            breakdown[key] = {
                "update_exported_s": round(exported_s, 1),
                "probe_answered_s": round(time.monotonic() - t_kill, 1),
            }
            updates += 1
            latest = export.payload.revision
            client.promote(POLICY, latest, reason=f"after the {fault} fault")
            if i % 2 == 1:
                client.rollback(POLICY, reason=f"rollback after the {fault} fault")
            workers.check()
        traffic.finish()
        deadline = time.monotonic() + 300
        while set(traffic.sent) - set(answered(client)) and time.monotonic() < deadline:
            time.sleep(1.0)
        time.sleep(0.2)  # the clock's last look
        # when each answer was first seen (the clock's 50 ms looks), not when this asks
        got = {**answered(client), **clock.seen}
        unanswered = set(traffic.sent) - set(got)
        failed = {e.payload.request_id for e in client.events(POLICY, ["infer.failed"])}
        revisions = client.revisions(POLICY)
        exports_per_update: dict = {}
        for e in client.events(POLICY, ["export.completed"]):
            exports_per_update.setdefault(e.causation_id, set()).add(e.payload.revision)
        wait_projected(s, client.catalog)
        workers.stop_all()
        problems = replay_differences(session, s, read_log(s))
        db.shutdown()
        out.update(
            {
                "events_sent": len(traffic.sent) + updates + 2 * len(faults),
                "requests_sent": len(traffic.sent),
                "send_retries": traffic.send_retries,
                "requests_never_confirmed": traffic.pending,
                "requests_unanswered": len(unanswered),
                "requests_failed": len(failed),
                "updates": updates,
                "lost": len(unanswered) + max(0, updates - len(exports_per_update)),
                "duplicate_revisions": max(0, len(revisions) - updates)
                + sum(len(v) - 1 for v in exports_per_update.values()),
                "transient_dead_letters": dead_letters(s),
                "catalog_equals_replay": not problems,
                "replay_problems": [p[:2000] for p in problems[:5]],
                "recovery_seconds": recovery,
                "recovery_breakdown": breakdown,
                "answer_latency_s_max": round(
                    max((got[r] - traffic.sent[r] for r in got if r in traffic.sent), default=0.0),
                    1,
                ),
                "longest_answer_gap_s": gaps,
                "targets": targets,
            }
        )
        out["met"] = {k: out[k] == v for k, v in TARGETS.items()}
        if cluster:
            out["met"]["longest_answer_gap_s"] = max(gaps.values()) <= _fault_cluster.GAP_TARGET_S
            out["killed"] = killed  # kafka-node: the active controller
    finally:
        if traffic is not None:
            traffic.halt.set()
        if clock is not None:
            clock.halt.set()
        if client is not None:
            client.close()
        if workers is not None:
            workers.stop_all()
        launcher.down(admin)
        out["seconds"] = round(time.monotonic() - t0, 1)
        if "lost" in out and not keep:
            shutil.rmtree(state, ignore_errors=True)
        else:
            print(f"logs kept in {state / 'logs'}", file=sys.stderr)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--smoke", action="store_true", help=f"faults {', '.join(SMOKE)} only")
    ap.add_argument("--faults", help=f"comma-separated, in order, from {', '.join(FULL)}")
    ap.add_argument("--down-s", type=float, default=3.0, help="seconds a killed part stays down")
    ap.add_argument("--steps", type=int, default=30, help="optimizer steps of each round's update")
    ap.add_argument("--keep", action="store_true", help="keep the state folder and worker logs")
    ap.add_argument(
        "--secure",
        action="store_true",
        help="credentials and ACLs on (mint dev up --secure): each worker its principal",
    )
    ap.add_argument(
        "--cluster",
        action="store_true",
        help="three Kafka brokers and three Cassandra nodes (faults: "
        + ", ".join(_fault_cluster.CLUSTER_FAULTS)
        + "; --smoke: the two node kills)",
    )
    args = ap.parse_args(argv)
    if args.cluster and args.secure:
        ap.error("--cluster runs without credentials: drop --secure")
    full = _fault_cluster.CLUSTER_FAULTS if args.cluster else FULL
    smoke = _fault_cluster.NODE_FAULTS if args.cluster else SMOKE
    faults = tuple(args.faults.split(",")) if args.faults else (smoke if args.smoke else full)
    unknown = [f for f in faults if f not in full]
    if unknown:
        ap.error(f"unknown fault {unknown[0]!r}: choose from {', '.join(full)}")
    out = run(faults, args.down_s, args.steps, args.smoke, args.keep, args.secure, args.cluster)
    print(json.dumps(out), flush=True)
    met = out.get("met", {})
    return 0 if met and all(met.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
