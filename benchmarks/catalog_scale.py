"""Catalog at design load: bulk-load N policies x M revisions, then time alias resolves.

Prints ONE JSON line: revisions/s and rows/s of the load (all processes together, wall clock),
resolve latency p50/p99 over random lookups at full size (``@alias`` and ``@N``), and the bytes
the keyspace takes on disk after a flush. Targets on a 2-core machine: load >= 20,000 rows/s,
alias-resolve p99 <= 2 ms.

    python -m benchmarks.catalog_scale            # 100,000 policies x 10 = 1,000,000 revisions
    python -m benchmarks.catalog_scale --smoke    # 1,000 x 10 = 10,000 revisions (the test)

The keyspace (bench_catalog_<random>) is dropped at the end unless --keep.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing as mp
import os
import random
import shutil
import statistics
import sys
import time
import uuid
from pathlib import Path

from catalog.bulk import BulkLoader, BulkPolicy
from catalog.cluster import connect
from catalog.migrate import migrate
from catalog.repository import CatalogRepository
from schemas.logs import configure_logging
from schemas.settings import MintSettings

TENANTS = 100


def names(i: int) -> tuple[str, str]:
    return f"tenant-{i % TENANTS:03d}", f"policy-{i:07d}"


def digest(i: int, n: int) -> str:
    return "sha256:" + hashlib.sha256(f"{i}/{n}".encode()).hexdigest()


def policies(start: int, stop: int, per_policy: int):
    for i in range(start, stop):
        tenant, policy = names(i)
        revs = [(digest(i, n), f"s3://adapters/{tenant}/{policy}/{n}") for n in range(1, per_policy + 1)]  # fmt: skip
        yield BulkPolicy(tenant, policy, "qwen3-30b-a3b", revs, aliases={"prod": per_policy})


def _load_slice(job: tuple, barrier, results) -> None:
    """One loader process: connect and prepare first, then load its slice after the barrier."""
    keyspace, start, stop, per_policy, concurrency = job
    cluster, session = connect(MintSettings())
    try:
        loader = BulkLoader(session, keyspace, concurrency=concurrency)
        barrier.wait()
        t0 = time.time()
        r = loader.load(policies(start, stop, per_policy))
        results.put({"revisions": r.revisions, "rows": r.rows, "requests": r.requests,
                     "start": t0, "end": time.time()})  # fmt: skip
    except Exception as e:
        results.put({"error": f"{type(e).__name__}: {e}"})
        raise
    finally:
        cluster.shutdown()


def bulk_load(keyspace: str, n_policies: int, per_policy: int, processes: int, concurrency: int):
    """Load with ``processes`` processes; the clock runs from the common start to the last end."""
    ctx = mp.get_context("spawn")
    barrier, results = ctx.Barrier(processes), ctx.Queue()
    bounds = [n_policies * k // processes for k in range(processes + 1)]
    procs = [
        ctx.Process(target=_load_slice, args=(
            (keyspace, bounds[k], bounds[k + 1], per_policy, concurrency), barrier, results))
        for k in range(processes)
    ]  # fmt: skip
    for p in procs:
        p.start()
    parts = [results.get(timeout=3600) for _ in procs]
    for p in procs:
        p.join()
    errors = [p["error"] for p in parts if "error" in p]
    if errors:
        raise RuntimeError(f"bulk load failed: {errors}")
    seconds = max(p["end"] for p in parts) - min(p["start"] for p in parts)
    return seconds, parts


def _percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=1000, method="inclusive")[int(q * 1000) - 1]


def time_resolves(repo: CatalogRepository, refs: list[str]) -> dict:
    for ref in refs[:200]:  # warm connections and caches
        repo.resolve(ref)
    lat = []
    for ref in refs:
        t0 = time.perf_counter()
        repo.resolve(ref)
        lat.append((time.perf_counter() - t0) * 1000)
    return {"p50_ms": round(_percentile(lat, 0.5), 3), "p99_ms": round(_percentile(lat, 0.99), 3),
            "max_ms": round(max(lat), 3), "n": len(lat)}  # fmt: skip


def settle(session, settings: MintSettings, keyspace: str, tables: list[str]) -> dict:
    """Flush the memtables (memtable_flush_period_in_ms) and wait until flushes and compactions
    are done, so that reads hit sstables and the disk figure is final; then measure it."""
    for t in tables:
        session.execute(f"ALTER TABLE {keyspace}.{t} WITH memtable_flush_period_in_ms = 1000")
    local = settings.state_dir / "cassandra" / "data" / keyspace
    t0 = time.monotonic()
    last, stable = None, 0
    while time.monotonic() - t0 < 180 and stable < 3:
        time.sleep(1.0)
        busy = session.execute(
            "SELECT task_id FROM system_views.sstable_tasks WHERE keyspace_name = %s "
            "ALLOW FILTERING", (keyspace,)).one() is not None  # fmt: skip
        size = _du(local) if local.exists() else None
        stable = stable + 1 if not busy and size == last else 0
        last = size
    for t in tables:
        session.execute(f"ALTER TABLE {keyspace}.{t} WITH memtable_flush_period_in_ms = 0")
    mib = sum(r.mebibytes for r in session.execute(
        "SELECT mebibytes FROM system_views.disk_usage WHERE keyspace_name = %s ALLOW FILTERING",
        (keyspace,)))  # fmt: skip
    return {"bytes_on_disk": last if last is not None else mib * 2**20, "disk_usage_mib": mib,
            "disk_measured_by": "du of the data dir" if last is not None else "system_views",
            "settle_seconds": round(time.monotonic() - t0, 1)}  # fmt: skip


def drop_keyspace(session, settings: MintSettings, keyspace: str) -> None:
    """Drop the benchmark keyspace and, on a local node, the snapshot that auto_snapshot keeps of
    a dropped keyspace (hundreds of MB at full size; there is no nodetool clearsnapshot here)."""
    session.execute(f"DROP KEYSPACE IF EXISTS {keyspace}", timeout=300)
    local = settings.state_dir / "cassandra" / "data" / keyspace
    if keyspace.startswith("bench_catalog_") and local.is_dir() and not settings.cassandra_external:
        shutil.rmtree(local, ignore_errors=True)


def _du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="1,000 policies x 10, 1,000 lookups")
    ap.add_argument("--policies", type=int, default=100_000)
    ap.add_argument("--revisions", type=int, default=10, help="revisions per policy")
    ap.add_argument("--processes", type=int, default=3)
    ap.add_argument("--concurrency", type=int, default=48, help="requests in flight per process")
    ap.add_argument("--lookups", type=int, default=10_000)
    ap.add_argument("--keep", action="store_true", help="keep the benchmark keyspace")
    args = ap.parse_args(argv)
    if args.smoke:
        args.policies, args.lookups = 1_000, 1_000
    settings = MintSettings()
    configure_logging(settings.log_level, "console")  # logs to stderr; stdout is the JSON line
    keyspace = f"bench_catalog_{uuid.uuid4().hex[:8]}"
    cluster, session = connect(settings)
    try:
        t0 = time.perf_counter()
        migrate(session, keyspace, settings.keyspace_replication)
        migrate_s = time.perf_counter() - t0

        load_s, parts = bulk_load(keyspace, args.policies, args.revisions, args.processes,
                                  args.concurrency)  # fmt: skip
        revisions = sum(p["revisions"] for p in parts)
        rows = sum(p["rows"] for p in parts)

        disk = settle(session, settings, keyspace,
                      ["revisions", "revisions_by_digest", "policies", "aliases",
                       "alias_history", "tenants"])  # fmt: skip
        repo = CatalogRepository(session, keyspace)
        rng = random.Random(7)
        picks = [rng.randrange(args.policies) for _ in range(args.lookups)]
        alias_refs = ["{}/{}@prod".format(*names(i)) for i in picks]
        number_refs = ["{}/{}@{}".format(*names(i), rng.randint(1, args.revisions))
                       for i in picks[: max(1, args.lookups // 5)]]  # fmt: skip
        check = repo.resolve(alias_refs[0])
        assert check.revision == args.revisions and check.digest == digest(picks[0], args.revisions)
        by_alias = time_resolves(repo, alias_refs)
        by_number = time_resolves(repo, number_refs)
        result = {
            "benchmark": "catalog_scale",
            "smoke": args.smoke,
            "keyspace": keyspace,
            "keyspace_dropped": not args.keep,
            "policies": args.policies,
            "revisions": revisions,
            "rows_written": rows,
            "processes": args.processes,
            "load_seconds": round(load_s, 2),
            "revisions_per_s": round(revisions / load_s),
            "rows_per_s": round(rows / load_s),
            "migrate_seconds": round(migrate_s, 2),
            "resolve_alias": by_alias,
            "resolve_number": by_number,
            **disk,
            "bytes_per_revision": round(disk["bytes_on_disk"] / max(revisions, 1), 1),
            "targets": {"rows_per_s": 20_000, "resolve_alias_p99_ms": 2.0},
            "meets_targets": {
                "rows_per_s": rows / load_s >= 20_000,
                "resolve_alias_p99_ms": by_alias["p99_ms"] <= 2.0,
            },  # fmt: skip
            "cpus": os.cpu_count(),
            "load_average_1m": round(os.getloadavg()[0], 2),
            "note": "one Cassandra node and the loader share these CPUs with other work",
        }
    finally:
        if not args.keep:
            drop_keyspace(session, settings, keyspace)
        cluster.shutdown()
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
