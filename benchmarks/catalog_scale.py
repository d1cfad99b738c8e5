"""Catalog at design load: import N policies x M revisions from a JSONL file, then time resolves.

The load goes through the operator's import path (``catalog.importer.import_file``, what
``mint catalog import FILE`` runs): a generated JSONL of N x M revisions, validated line by line
and written by the importer's writer process(es); the import starts once the machine is idle
(below) or after ``--import-idle-timeout``. Then, after the node has flushed and compacted
(nodetool-free: for 3 s in a row no ``system_views.sstable_tasks`` entry for the keyspace, no
active or pending task in the compaction and flush pools of ``system_views.thread_pools``, and
a data directory of constant size) and the machine is idle (1-minute load average below
``--idle-load``, polled until ``--idle-timeout``: the JSON says which came first), it times alias
resolves: cold catalog reads through the driver (``CatalogRepository.resolve``, each policy read
once, so no read repeats a key) and the serving engine's cached resolution
(``workers.serving.resolution.ResolutionCache`` hits).

Prints ONE JSON line; every figure has its target in ``targets``, the verdict in ``met`` and the
load average beside it. Targets (issue 15): import >= 45,000 catalog rows/s (rows written:
revision, digest-index, alias, history, policy and tenant rows, as this benchmark always counted
them), catalog resolve p99 <= 1.5 ms, cached resolve p99 <= 0.1 ms.

    python -m benchmarks.catalog_scale            # 100,000 policies x 10 = 1,000,000 revisions
    python -m benchmarks.catalog_scale --smoke    # 1,000 x 10 = 10,000 revisions (the test)

The keyspace (bench_catalog_<random>) and the generated file are removed at the end unless --keep.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import resource
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

from benchmarks._harness import load_1m, parser
from catalog.cluster import connect
from catalog.importer import import_file
from catalog.migrate import migrate
from catalog.refs import parse_ref
from catalog.repository import CatalogRepository
from schemas.logs import configure_logging
from schemas.settings import MintSettings
from workers.serving.resolution import ResolutionCache

TENANTS = 100
BASE_MODEL = "qwen3-30b-a3b"
TARGETS = {"import_rows_per_s": 45_000, "resolve_catalog_p99_ms": 1.5, "resolve_cached_p99_ms": 0.1}


def names(i: int) -> tuple[str, str]:
    return f"tenant-{i % TENANTS:03d}", f"policy-{i:07d}"


def digest(i: int, n: int) -> str:
    return "sha256:" + hashlib.sha256(f"{i}/{n}".encode()).hexdigest()


def write_jsonl(path: Path, n_policies: int, per_policy: int) -> int:
    """One line per revision, as another registry's export would give them; the last revision
    of every policy carries alias ``prod``. Returns the bytes written."""
    with path.open("w") as f:
        for i in range(n_policies):
            t, p = names(i)
            for n in range(1, per_policy + 1):
                aliases = ',"aliases":["prod"]' if n == per_policy else ""
                f.write(
                    f'{{"tenant":"{t}","policy":"{p}","revision":{n},"digest":"{digest(i, n)}",'
                    f'"uri":"s3://adapters/{t}/{p}/{n}","base_model":"{BASE_MODEL}",'
                    f'"created_at":"2025-01-01T00:00:00Z","rank":8{aliases}}}\n'
                )
    return path.stat().st_size


def cpu_seconds(settings: MintSettings) -> dict[str, float | None]:
    """CPU seconds so far of this process (the reader), its finished children (the writers) and,
    on a local node, Cassandra (from /proc; None elsewhere)."""
    me, kids = (resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    node = None
    pid_file = settings.state_dir / "cassandra" / "cassandra.pid"
    if not settings.cassandra_external and pid_file.exists():
        try:
            fields = Path(f"/proc/{pid_file.read_text().strip()}/stat").read_text()
            utime, stime = fields.rsplit(")", 1)[1].split()[11:13]
            node = (int(utime) + int(stime)) / os.sysconf("SC_CLK_TCK")
        except (OSError, ValueError):
            node = None
    return {
        "reader": me.ru_utime + me.ru_stime,
        "writers": kids.ru_utime + kids.ru_stime,
        "cassandra": node,
    }


def _percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=1000, method="inclusive")[int(q * 1000) - 1]


def _summary(lat_ms: list[float], digits: int = 3) -> dict:
    return {
        "p50_ms": round(_percentile(lat_ms, 0.5), digits),
        "p99_ms": round(_percentile(lat_ms, 0.99), digits),
        "max_ms": round(max(lat_ms), digits),
        "n": len(lat_ms),
    }


def time_catalog_resolves(repo: CatalogRepository, refs: list[str], warmup: list[str]) -> dict:
    """One driver read per reference (each policy once, so no read repeats a key); the warm-up
    opens connections and prepares paths on other policies' keys. References are parsed first:
    the engine resolves the Ref it built from a decoded request, it never parses text."""
    for ref in warmup:
        repo.resolve(ref)
    before = load_1m()
    lat = []
    for ref in [parse_ref(r) for r in refs]:
        t0 = time.perf_counter()
        repo.resolve(ref)
        lat.append((time.perf_counter() - t0) * 1000)
    return {**_summary(lat), "load_average_1m": before, "load_average_1m_after": load_1m()}


def time_cached_resolves(repo: CatalogRepository, texts: list[str], passes: int = 5) -> dict:
    """The serving engine's resolution cache: filled once from the catalog, then hits only."""
    cache = ResolutionCache(repo.resolve, ttl_s=3600.0, max_entries=len(texts) + 1)
    refs = [parse_ref(r) for r in texts]  # as the engine holds them (see time_catalog_resolves)
    for ref in refs:
        cache.resolve(ref)
    before = load_1m()
    lat = []
    clock = time.perf_counter_ns
    for _ in range(passes):
        for ref in refs:
            t0 = clock()
            cache.resolve(ref)
            lat.append((clock() - t0) / 1e6)
    assert cache.misses == len(refs) and cache.hits == passes * len(refs)
    return {**_summary(lat, 5), "load_average_1m": before, "load_average_1m_after": load_1m()}


_SETTLE_POOLS = {"CompactionExecutor", "MemtableFlushWriter", "MemtablePostFlush"}


def settle(
    session, settings: MintSettings, keyspace: str, tables: list[str], timeout_s: float = 180
) -> dict:
    """Flush the memtables (memtable_flush_period_in_ms) and wait until flushes and compactions
    are done: for 3 s in a row no sstable task for the keyspace (``system_views.sstable_tasks``),
    no active or pending task in the node's compaction and flush pools
    (``system_views.thread_pools``) and a constant data-directory size; so that reads hit
    sstables and the disk figure is final. Then measure it."""
    for t in tables:
        session.execute(f"ALTER TABLE {keyspace}.{t} WITH memtable_flush_period_in_ms = 1000")
    local = settings.state_dir / "cassandra" / "data" / keyspace
    t0 = time.monotonic()
    last, stable = None, 0
    while time.monotonic() - t0 < timeout_s and stable < 3:
        time.sleep(1.0)
        busy = (
            session.execute(
                "SELECT task_id FROM system_views.sstable_tasks WHERE keyspace_name = %s "
                "ALLOW FILTERING",
                (keyspace,),
            ).one()
            is not None
        )
        busy = busy or any(
            r.active_tasks or r.pending_tasks
            for r in session.execute(
                "SELECT name, active_tasks, pending_tasks FROM system_views.thread_pools"
            )
            if r.name in _SETTLE_POOLS
        )
        size = _du(local) if local.exists() else None
        stable = stable + 1 if not busy and size == last else 0
        last = size
    for t in tables:
        session.execute(f"ALTER TABLE {keyspace}.{t} WITH memtable_flush_period_in_ms = 0")
    mib = sum(
        r.mebibytes
        for r in session.execute(
            "SELECT mebibytes FROM system_views.disk_usage WHERE keyspace_name = %s ALLOW FILTERING",
            (keyspace,),
        )
    )
    return {
        "bytes_on_disk": last if last is not None else mib * 2**20,
        "disk_usage_mib": mib,
        "disk_measured_by": "du of the data dir" if last is not None else "system_views",
        "compaction_settled": stable >= 3,
        "settle_seconds": round(time.monotonic() - t0, 1),
    }


def wait_idle(below: float, timeout_s: float) -> dict:
    """Poll the 1-minute load average until it is below ``below`` or ``timeout_s`` passed."""
    t0 = time.monotonic()
    while load_1m() >= below and time.monotonic() - t0 < timeout_s:
        time.sleep(2.0)
    return {
        "idle_below": below,
        "idle_reached": load_1m() < below,
        "idle_wait_seconds": round(time.monotonic() - t0, 1),
        "load_average_1m": load_1m(),
    }


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
    ap = parser(__doc__, "1,000 policies x 10, 1,000 lookups")
    ap.size("--policies", 1_000, 100_000, "policies imported")
    ap.size("--lookups", 1_000, 10_000, "alias lookups timed")
    ap.size("--idle-timeout", 0.0, 120.0, "seconds to wait for --idle-load before timing")
    ap.size("--import-idle-timeout", 0.0, 60.0, "seconds to wait for it before the import")
    ap.add_argument("--revisions", type=int, default=10, help="revisions per policy")
    ap.add_argument("--workers", type=int, default=1, help="importer writer processes")
    ap.add_argument("--concurrency", type=int, default=64, help="requests in flight per writer")
    ap.add_argument("--chunk-rows", type=int, default=20_000)
    ap.add_argument(
        "--idle-load",
        type=float,
        default=1.0,
        help="wait for a 1-minute load average below this before timing resolves",
    )
    ap.add_argument("--keep", action="store_true", help="keep the keyspace and the JSONL file")
    args = ap.parse_args(argv)
    args.lookups = min(args.lookups, args.policies - 100)
    settings = MintSettings()
    configure_logging(settings.log_level, "console")  # logs to stderr; stdout is the JSON line
    keyspace = f"bench_catalog_{uuid.uuid4().hex[:8]}"
    workdir = Path(tempfile.mkdtemp(prefix="mint-catalog-scale-"))
    cluster, session = connect(settings)
    try:
        t0 = time.perf_counter()
        migrate(session, keyspace, settings.keyspace_replication)
        migrate_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        src = workdir / "revisions.jsonl"
        file_bytes = write_jsonl(src, args.policies, args.revisions)
        generate_s = time.perf_counter() - t0

        idle_before = wait_idle(args.idle_load, args.import_idle_timeout)
        load_before, cpu0 = load_1m(), cpu_seconds(settings)
        imp = import_file(
            session,
            keyspace,
            src,
            settings=settings,
            workers=args.workers,
            concurrency=args.concurrency,
            chunk_rows=args.chunk_rows,
        )
        load_after, cpu1 = load_1m(), cpu_seconds(settings)
        c = imp.counts
        cpu_us = {
            k: None if cpu1[k] is None else round((cpu1[k] - cpu0[k]) / c.accepted * 1e6, 1)
            for k in cpu0
        }
        expected = args.policies * args.revisions
        assert imp.complete and c.accepted == expected and c.rejected == 0, imp.as_dict()

        disk = settle(
            session,
            settings,
            keyspace,
            ["revisions", "revisions_by_digest", "policies", "aliases", "alias_history", "tenants"],
            timeout_s=30 if args.smoke else 300,
        )
        idle = wait_idle(args.idle_load, args.idle_timeout)
        repo = CatalogRepository(session, keyspace)
        rng = random.Random(7)
        picks = rng.sample(range(args.policies), args.lookups + 100)
        measured, warm = picks[: args.lookups], picks[args.lookups :]
        alias_refs = ["{}/{}@prod".format(*names(i)) for i in measured]
        number_refs = [
            "{}/{}@{}".format(*names(i), rng.randint(1, args.revisions))
            for i in measured[: max(1, args.lookups // 5)]
        ]
        check = repo.resolve(alias_refs[0])
        assert check.revision == args.revisions and check.digest == digest(picks[0], args.revisions)
        warm_refs = ["{}/{}@prod".format(*names(i)) for i in warm]
        by_alias = time_catalog_resolves(repo, alias_refs, warm_refs)
        by_number = time_catalog_resolves(repo, number_refs, [])
        cached = time_cached_resolves(repo, alias_refs)
        rows_per_s = imp.rows_per_s
        result = {
            "benchmark": "catalog_scale",
            "smoke": args.smoke,
            "keyspace": keyspace,
            "keyspace_dropped": not args.keep,
            "file_kept": str(src) if args.keep else None,
            "policies": args.policies,
            "revisions": c.accepted,
            "rows_written": c.rows_written,
            "import_rows_per_s": round(rows_per_s),
            "import": {
                "path": "catalog.importer.import_file (mint catalog import)",
                "file_bytes": file_bytes,
                "generate_seconds": round(generate_s, 2),
                "seconds": round(imp.seconds, 2),
                "rows_per_s": round(rows_per_s),
                "revisions_per_s": round(imp.revisions_per_s),
                "lines": c.lines,
                "rejected": c.rejected,
                "workers": args.workers,
                "concurrency": args.concurrency,
                "chunk_rows": args.chunk_rows,
                "cpu_us_per_revision": cpu_us,
                "reader_max_rss_mb": round(
                    resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
                ),
                "idle_before": idle_before,
                "load_average_1m_before": load_before,
                "load_average_1m": load_after,
            },
            "migrate_seconds": round(migrate_s, 2),
            "settle": {
                **{k: v for k, v in disk.items() if k.startswith(("compaction", "settle"))},
                **idle,
            },
            "resolve_catalog": by_alias,
            "resolve_number": by_number,
            "resolve_cached": cached,
            "bytes_on_disk": disk["bytes_on_disk"],
            "disk_usage_mib": disk["disk_usage_mib"],
            "disk_measured_by": disk["disk_measured_by"],
            "bytes_per_revision": round(disk["bytes_on_disk"] / max(c.accepted, 1), 1),
            "targets": TARGETS,
            "met": {
                "import_rows_per_s": rows_per_s >= TARGETS["import_rows_per_s"],
                "resolve_catalog_p99_ms": by_alias["p99_ms"] <= TARGETS["resolve_catalog_p99_ms"],
                "resolve_cached_p99_ms": cached["p99_ms"] <= TARGETS["resolve_cached_p99_ms"],
            },
            "cpus": os.cpu_count(),
            "load_average_1m": load_1m(),
            "note": "one Cassandra node, the importer and the benchmark share these CPUs with "
            "other work; import_rows_per_s counts catalog rows written (revisions_per_s: lines)",
        }
    finally:
        if not args.keep:
            drop_keyspace(session, settings, keyspace)
            shutil.rmtree(workdir, ignore_errors=True)
        cluster.shutdown()
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
