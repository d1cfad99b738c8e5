"""Import revisions exported from another registry: ``mint catalog import FILE``.

The file is JSON Lines, one revision per line::

    {"tenant": "acme", "policy": "math-rl", "revision": 3, "digest": "sha256:<64 hex>",
     "uri": "s3://adapters/acme/math-rl/3", "base_model": "qwen3-30b-a3b",
     "created_at": "2025-01-02T03:04:05Z", "rank": 8, "aliases": ["prod"]}

``created_at``, ``rank`` and ``aliases`` are optional; nothing else is accepted (a misspelt field
would otherwise be lost). Parquet is not read: pyarrow is not a dependency of MinT.

- **Validation**: each line is an ``ImportRow`` (pydantic; the names, digest and store-URI rules
  of the wire events, the URI inside the policy's namespace) and is then checked against what
  came before it in the file and what the catalog holds: one content per revision number, one
  revision per digest, one target per alias, one base model per policy, and only into policies
  that are new or were created by an import and have no live registrations since. A bad line
  goes to ``FILE.rejects.jsonl`` (line number, reason, the line itself) and is counted; the same
  line twice is counted as a duplicate and written once.
- **Rows**: those a registration writes (``revisions``, ``revisions_by_digest``, the static
  ``latest_revision``, ``policies``, ``tenants``) and, for each alias, its ``aliases`` row and
  history row ``seq`` 1 (kind ``promote``, by ``import``), through ``bulk.RowWriter``: unlogged
  batches per partition key, no lightweight transactions, values encoded once.
- **Resumable**: after each chunk of lines is written, ``FILE.import-state.json`` records the
  byte offset and line number reached, the counts and the size of the rejects file. A killed
  import re-reads (without writing) the lines before the checkpoint, to know the policies,
  revisions and aliases they defined, and continues after it; the rejects file is cut back to
  its checkpointed size.
- **Idempotent**: every write is an upsert of values taken from the file (a missing
  ``created_at`` is the time the file was first imported, kept in the state file), and the
  pointer cells (``latest_revision``, alias rows) are written with a timestamp from the past
  (``bulk.PAST_US`` + revision): the highest revision wins whatever order the writes land in,
  and a live compare-and-set made after the import always wins over a re-import. Importing the
  same file again leaves the same catalog.
- **Not in the event log**: imported revisions were never ``export.completed`` events, so
  ``mint catalog rebuild`` (a replay of the log) does not recreate them and ``--compare`` lists
  them as only in the live keyspace. The import file is the record of them: keep it.

This module reads the file in chunks, has each checked, writes it (``bulk.RowWriter``, from
worker processes if asked) and checkpoints it. A line's own rules and its rejects record are
``import_rows.py``; the checks across lines and against the catalog ``import_checks.py``; the
counts, the result and the checkpoint ``import_state.py``.
"""

from __future__ import annotations

import gc
import multiprocessing as mp
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

import structlog
from cassandra.cluster import Session

from catalog.bulk import RowSet, RowWriter
from catalog.exceptions import MigrationError
from catalog.import_checks import IMPORTED_BY, CatalogView, Checker, check_chunk
from catalog.import_rows import epoch_ms, reject_record
from catalog.import_state import ImportProgress, ImportResult, ImportState, default_paths

# What callers import from here; the rows, the checks and the checkpoint have their own modules.
__all__ = ["ImportProgress", "ImportResult", "ImportState", "default_paths", "import_file"]

log = structlog.get_logger()


# ---------------------------------------------------------------------------- writer processes

# An import allocates millions of short-lived tuples and lists. With CPython's default thresholds
# the cyclic collector runs every 700 allocations and, every tenth and hundredth time, walks the
# older generations too: the reader's growing per-policy state, the driver's objects. Measured
# here on 200,000 revisions: building the batches 13.5 -> 1.6-3.6 µs a revision, validating
# 21 -> 17-18 µs, with the young generation collected every 100,000 allocations and what existed
# before the import frozen out of the collector's walks. Nothing the import keeps forms cycles.
_GC_THRESHOLD = (100_000, 50, 1000)


@contextmanager
def _gc_tuned() -> Iterator[None]:
    old = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(*_GC_THRESHOLD)
    try:
        yield
    finally:
        gc.set_threshold(*old)
        gc.unfreeze()


_WRITER: RowWriter | None = None


def _init_writer(settings: Any, keyspace: str, concurrency: int) -> None:
    global _WRITER
    from catalog.cluster import connect

    _, session = connect(settings)
    _WRITER = RowWriter(session, keyspace, by=IMPORTED_BY, concurrency=concurrency)
    gc.freeze()  # this process only writes until the pool ends: see _GC_THRESHOLD
    gc.set_threshold(*_GC_THRESHOLD)


def _write(rows: RowSet) -> int:
    assert _WRITER is not None
    return _WRITER.write(rows)


# ---------------------------------------------------------------------------- reading the file


def _chunks(
    f: IO[bytes], offset: int, line: int, size: int, stop: int | None = None
) -> Iterator[tuple[list[tuple[int, bytes]], int, int]]:
    """Chunks of up to ``size`` non-blank lines from byte ``offset`` (after line ``line``), each
    with the byte offset and line number after it; up to byte ``stop`` if given."""
    f.seek(offset)
    lines: list[tuple[int, bytes]] = []
    for raw in f:
        line += 1
        offset += len(raw)
        if raw.strip():
            lines.append((line, raw))
        if len(lines) >= size or offset == stop:
            yield lines, offset, line
            lines = []
            if offset == stop:
                return
    if lines:
        yield lines, offset, line


@dataclass
class _Chunk:
    rows: RowSet
    end_offset: int
    end_line: int
    rejects_bytes: int
    lines: int
    accepted: int
    duplicates: int
    rejected: int


@dataclass
class _Checkpoints:
    """What each written chunk moves forward, in file order: the counts, the checkpoint (saved
    after the chunk's rows are written) and the progress callback. ``stop_after``: the test
    hook that stops the import as a kill would, after that many chunks."""

    rejects: IO[bytes]
    state: ImportState
    state_path: Path
    total: int  # bytes of the file
    t0: float  # when writing began (after any re-reading)
    on_progress: Callable[[ImportProgress], None] | None
    stop_after: int | None
    written: int = 0  # catalog rows written by this run
    accepted: int = 0  # revisions accepted by this run
    done: int = 0  # chunks checkpointed by this run

    def finish(self, chunk: _Chunk, rows_written: int) -> None:
        self.rejects.flush()
        counts, state = self.state.counts, self.state
        counts.lines += chunk.lines
        counts.accepted += chunk.accepted
        counts.duplicates += chunk.duplicates
        counts.rejected += chunk.rejected
        counts.rows_written += rows_written
        self.written += rows_written
        self.accepted += chunk.accepted
        self.done += 1
        state.offset, state.line = chunk.end_offset, chunk.end_line
        state.rejects_bytes = chunk.rejects_bytes
        state.save(self.state_path)
        if self.on_progress:
            rate = self.written / max(time.perf_counter() - self.t0, 1e-9)
            self.on_progress(ImportProgress(chunk.end_offset, self.total, counts, rate))

    def stopped(self) -> bool:
        return self.stop_after is not None and self.done >= self.stop_after


# ---------------------------------------------------------------------------- the import


def import_file(
    session: Session,
    keyspace: str,
    path: str | Path,
    *,
    settings: Any = None,
    workers: int = 0,
    chunk_rows: int = 20_000,
    concurrency: int = 64,
    restart: bool = False,
    state_path: Path | None = None,
    rejects_path: Path | None = None,
    on_progress: Callable[[ImportProgress], None] | None = None,
    stop_after_chunks: int | None = None,
) -> ImportResult:
    """Import the JSONL file at ``path`` into ``keyspace`` (migrated already).

    ``workers`` > 0 writes from that many processes (each its own connection, from
    ``settings``) while this one reads and checks the file; 0 writes from this process.
    ``stop_after_chunks`` stops the import as a kill would, once that many chunks are
    checkpointed (chunks in flight are abandoned mid-write): a test hook for resumption.
    """
    path = Path(path)
    if chunk_rows < 1 or workers < 0 or concurrency < 1:
        raise ValueError("chunk_rows and concurrency must be >= 1, workers >= 0")
    meta = session.cluster.metadata.keyspaces.get(keyspace)
    if meta is None or "revisions" not in meta.tables:
        raise MigrationError(
            f"keyspace {keyspace!r} holds no catalog: run `mint catalog migrate --keyspace "
            f"{keyspace}` first"
        )
    d_state, d_rejects = default_paths(path)
    state_path, rejects_path = state_path or d_state, rejects_path or d_rejects
    state = ImportState.resume(state_path, keyspace, path, restart=restart)
    resumed_from = state.line
    total = state.file["size"]

    view = CatalogView(session, keyspace, concurrency)
    checker = Checker(view, epoch_ms(datetime.fromisoformat(state.started_at)))
    t_start = time.perf_counter()
    counts = state.counts
    reread_s = 0.0
    with _gc_tuned(), path.open("rb") as f:
        if state.offset:
            # Re-read (without writing) what the checkpoint covers, to know what it defined.
            for lines, end, _ in _chunks(f, 0, 0, chunk_rows, stop=state.offset):
                check_chunk(checker, lines)
                if on_progress:
                    on_progress(ImportProgress(end, total, counts, 0.0, rereading=True))
            reread_s = time.perf_counter() - t_start
        rejects = rejects_path.open("r+b" if rejects_path.exists() else "w+b")
        pool = None
        try:
            rejects.truncate(state.rejects_bytes)
            rejects.seek(state.rejects_bytes)
            writer = None
            if workers:
                ctx = mp.get_context("spawn")
                pool = ctx.Pool(
                    workers, initializer=_init_writer, initargs=(settings, keyspace, concurrency)
                )
            else:
                writer = RowWriter(session, keyspace, by=IMPORTED_BY, concurrency=concurrency)
            out = _Checkpoints(
                rejects,
                state,
                state_path,
                total,
                t_start + reread_s,
                on_progress,
                stop_after_chunks,
            )
            complete = _write_chunks(f, checker, writer, pool, chunk_rows, max(2, 2 * workers), out)
        finally:
            rejects.close()
            if pool is not None:
                pool.terminate()
                pool.join()
    if complete:
        state.completed_at = datetime.now(UTC).isoformat()
        state.save(state_path)
    seconds = time.perf_counter() - t_start - reread_s
    res = ImportResult(
        str(path),
        keyspace,
        complete,
        counts,
        round(seconds, 3),
        out.written,
        out.accepted,
        resumed_from,
        round(reread_s, 3),
        str(rejects_path),
        str(state_path),
        workers,
    )
    log.info(
        "import finished" if complete else "import stopped",
        path=str(path),
        keyspace=keyspace,
        **asdict(counts),
        seconds=round(seconds, 2),
        rows_per_s=round(res.rows_per_s),
    )
    return res


def _write_chunks(
    f: IO[bytes],
    checker: Checker,
    writer: RowWriter | None,
    pool: Any,
    chunk_rows: int,
    window: int,
    out: _Checkpoints,
) -> bool:
    """Check and write the chunks after the checkpoint, from this process (``writer``) or the
    pool's (up to ``window`` chunks in flight), checkpointing each in file order. True: the
    whole file was written; False: stopped by the test hook."""
    pending: deque[tuple[_Chunk, Any]] = deque()
    for lines, end, last in _chunks(f, out.state.offset, out.state.line, chunk_rows):
        rows, bad, ok, dups = check_chunk(checker, lines)
        for n, reason, raw in bad:
            out.rejects.write(reject_record(n, reason, raw))
        chunk = _Chunk(rows, end, last, out.rejects.tell(), len(lines), ok, dups, len(bad))
        if pool is None:
            assert writer is not None
            out.finish(chunk, writer.write(rows))
        else:
            pending.append((chunk, pool.apply_async(_write, (rows,))))
            while len(pending) >= window and not out.stopped():
                c, r = pending.popleft()
                out.finish(c, r.get())
        if out.stopped():
            return False
    while pending and not out.stopped():
        c, r = pending.popleft()
        out.finish(c, r.get())
    return not pending
