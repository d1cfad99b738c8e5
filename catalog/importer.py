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
"""

from __future__ import annotations

import gc
import hashlib
import json
import multiprocessing as mp
import os
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import IO, Any

import structlog
from cassandra import ConsistencyLevel
from cassandra.cluster import Session
from cassandra.concurrent import execute_concurrent_with_args
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from catalog.bulk import RowSet, RowWriter
from catalog.cluster import DRIVER_ERRORS
from catalog.exceptions import CatalogUnavailable, Conflict, MigrationError
from schemas.names import AliasName, Digest, PolicyName, StoreUri, TenantName, in_namespace

log = structlog.get_logger()

IMPORTED_BY = "import"
STATE_VERSION = 1
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MS = timedelta(milliseconds=1)
_RAW_KEPT = 4096  # characters of a rejected line kept in the rejects file


class ImportRow(BaseModel):
    """One line of an import file: one revision of one policy."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    tenant: TenantName
    policy: PolicyName
    revision: int = Field(ge=1, le=2**31 - 1, strict=True)
    digest: Digest
    uri: StoreUri
    base_model: str = Field(min_length=1, max_length=512)
    created_at: datetime | None = None
    rank: int | None = Field(None, ge=1, le=1024, strict=True)
    aliases: list[AliasName] = Field(default_factory=list, max_length=64)

    @model_validator(mode="after")
    def _row_checks(self) -> ImportRow:
        if not in_namespace(self.uri, self.tenant, self.policy):
            raise ValueError(
                f"uri {self.uri!r} lies outside {self.tenant}/{self.policy}: its path must "
                f"contain '/{self.tenant}/{self.policy}/' (serving opens it as that policy's)"
            )
        if len(set(self.aliases)) != len(self.aliases):
            raise ValueError(f"aliases {self.aliases} name an alias twice")
        return self


_EXPECTED = {
    "tenant": "1-63 of [a-z0-9-] starting with a letter or digit",
    "policy": "1-127 of [a-z0-9._-] starting with a letter or digit",
    "digest": "'sha256:' and 64 lowercase hex digits",
    "aliases": "1-32 of [a-z0-9-] starting with a letter, e.g. 'prod'",
}


def row_error(e: ValidationError) -> str:
    """One readable reason per wrong field: the field, what is wrong, what was given, and for the
    name and digest rules what is expected."""
    parts = []
    for err in e.errors():
        loc = ".".join(str(p) for p in err["loc"])
        field_name = str(err["loc"][0]) if err["loc"] else ""
        if err["type"] == "json_invalid":
            parts.append(f"not a JSON object: {err['msg']}")
            continue
        msg = err["msg"].removeprefix("Value error, ")
        if not loc and err["type"] == "value_error":
            parts.append(msg)  # the row's own checks: the message starts with the field
            continue
        if err["type"] == "string_pattern_mismatch" and field_name in _EXPECTED:
            msg = f"not valid: expected {_EXPECTED[field_name]}"
        given = err.get("input")
        shown = "" if isinstance(given, dict) or not loc else f" (got {given!r:.120})"
        parts.append(f"{loc or 'row'}: {msg}{shown}")
    return "; ".join(parts)


def parse_row(line: bytes | str) -> ImportRow:
    """Validate one line; raises ValueError with ``row_error``'s reason."""
    try:
        return ImportRow.model_validate_json(line)
    except ValidationError as e:
        raise ValueError(row_error(e)) from None


def _ms(at: datetime) -> int:
    at = at.replace(tzinfo=UTC) if at.tzinfo is None else at
    return (at - _EPOCH) // _MS


# ---------------------------------------------------------------------------- results and state


@dataclass
class ImportCounts:
    lines: int = 0  # non-blank lines read
    accepted: int = 0  # revisions written
    duplicates: int = 0  # a line repeating an accepted one exactly (written once)
    rejected: int = 0  # lines in the rejects file
    rows_written: int = 0  # catalog rows written (revision, digest, alias, history, policy, tenant)


@dataclass
class ImportProgress:
    bytes_done: int
    bytes_total: int
    counts: ImportCounts
    rows_per_s: float  # catalog rows written per second in this run
    rereading: bool = False  # re-reading the lines before the checkpoint


@dataclass
class ImportResult:
    path: str
    keyspace: str
    complete: bool
    counts: ImportCounts
    seconds: float  # wall time of this run
    written_this_run: int  # catalog rows written by this run
    accepted_this_run: int
    resumed_from_line: int  # 0: the run read the file from the start
    reread_seconds: float
    rejects_path: str
    state_path: str
    workers: int

    @property
    def rows_per_s(self) -> float:
        return self.written_this_run / self.seconds if self.seconds else 0.0

    @property
    def revisions_per_s(self) -> float:
        return self.accepted_this_run / self.seconds if self.seconds else 0.0

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["rows_per_s"] = round(self.rows_per_s)
        d["revisions_per_s"] = round(self.revisions_per_s)
        return d


def _identity(path: Path) -> dict[str, Any]:
    st = path.stat()
    with path.open("rb") as f:
        head = hashlib.sha256(f.read(1 << 16)).hexdigest()
    return {"path": str(path.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns,
            "head_sha256": head}  # fmt: skip


@dataclass
class ImportState:
    """The checkpoint beside the file (``FILE.import-state.json``)."""

    keyspace: str
    file: dict[str, Any]
    started_at: str  # first import of this file into this keyspace: created_at of undated rows
    offset: int = 0  # bytes of the file fully written
    line: int = 0  # lines of the file fully written
    rejects_bytes: int = 0
    counts: ImportCounts = field(default_factory=ImportCounts)
    completed_at: str | None = None
    updated_at: str | None = None
    version: int = STATE_VERSION

    def save(self, path: Path) -> None:
        self.updated_at = datetime.now(UTC).isoformat()
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=1) + "\n")
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: Path) -> ImportState | None:
        if not path.exists():
            return None
        try:
            raw = json.loads(path.read_text())
            if raw.get("version") != STATE_VERSION:
                raise ValueError(f"version {raw.get('version')}, expected {STATE_VERSION}")
            raw["counts"] = ImportCounts(**raw["counts"])
            return cls(**raw)
        except (ValueError, TypeError, KeyError) as e:
            raise Conflict(
                f"import state {str(path)!r} cannot be read ({e}); delete it (or pass --restart) "
                "to import the file from the start"
            ) from e


# ---------------------------------------------------------------------------- the catalog's view


@dataclass(frozen=True)
class _Existing:
    base_model: str
    created_by: str
    retired_at: datetime | None
    newest: tuple[int, str] | None = None  # newest revision and its creator, read when needed


class _CatalogView:
    """What the catalog holds before the import touches a tenant: its policies (one partition
    read per tenant) and, for policies an earlier import created, their newest revision."""

    def __init__(self, session: Session, keyspace: str, concurrency: int) -> None:
        self.session, self.keyspace, self.concurrency = session, keyspace, concurrency
        ks = keyspace
        self._policies = self._prepare(
            f"SELECT policy, base_model, created_by, retired_at FROM {ks}.policies WHERE tenant = ?"
        )
        self._tenant = self._prepare(f"SELECT tenant FROM {ks}.tenants WHERE tenant = ?")
        self._newest = self._prepare(
            f"SELECT revision, created_by FROM {ks}.revisions WHERE tenant = ? AND policy = ? "
            "LIMIT 1"
        )
        self.tenants: dict[str, dict[str, _Existing]] = {}
        self.tenant_rows: set[str] = set()

    def _prepare(self, cql: str):
        stmt = self.session.prepare(cql)
        stmt.consistency_level = ConsistencyLevel.LOCAL_QUORUM
        stmt.fetch_size = 5000
        return stmt

    def _run(self, stmt, args: list[tuple]) -> list:
        results = execute_concurrent_with_args(
            self.session, stmt, args, concurrency=self.concurrency, raise_on_first_error=False
        )
        out = []
        for ok, value in results:
            if not ok:
                raise CatalogUnavailable(
                    f"reading keyspace {self.keyspace!r} failed ({type(value).__name__}: "
                    f"{value}); check `mint dev status` or the cluster, then re-run the import "
                    "(it resumes from its checkpoint)"
                ) from value
            try:
                out.append(list(value))  # further pages are fetched here
            except DRIVER_ERRORS as e:
                raise CatalogUnavailable(f"reading keyspace {self.keyspace!r} failed: {e}") from e
        return out

    def load_tenants(self, tenants: list[str]) -> None:
        args = [(t,) for t in tenants]
        for t, rows, trow in zip(
            tenants, self._run(self._policies, args), self._run(self._tenant, args), strict=True
        ):
            self.tenants[t] = {
                r.policy: _Existing(r.base_model, r.created_by or "", r.retired_at) for r in rows
            }
            if trow:
                self.tenant_rows.add(t)

    def load_newest(self, keys: list[tuple[str, str]]) -> None:
        for (t, p), rows in zip(keys, self._run(self._newest, keys), strict=True):
            e = self.tenants[t][p]
            newest = (rows[0].revision, rows[0].created_by or "") if rows else (0, IMPORTED_BY)
            self.tenants[t][p] = _Existing(e.base_model, e.created_by, e.retired_at, newest)


# ---------------------------------------------------------------------------- per-file checks


class _Policy:
    __slots__ = ("base_model", "refused", "latest", "revs", "digests", "aliases")

    def __init__(self, base_model: str | None, refused: str | None = None) -> None:
        self.base_model = base_model  # None: new to the catalog, set by its first row
        self.refused = refused
        self.latest = 0
        self.revs: dict[int, tuple[int, int]] = {}  # revision -> (content hash, line)
        self.digests: dict[int, int] = {}  # hash of the digest -> revision
        self.aliases: dict[str, tuple[int, int]] = {}  # alias -> (revision, line)


_DUPLICATE = "duplicate"


class _Checker:
    """The checks that need what came before a line: in file order, so a resumed import that
    re-reads the lines before its checkpoint decides every line the same way."""

    def __init__(self, view: _CatalogView, default_created_ms: int) -> None:
        self.view = view
        self.default_created_ms = default_created_ms
        self.policies: dict[tuple[str, str], _Policy] = {}
        self.tenants_done: set[str] = set()

    def prepare(self, rows: list[ImportRow]) -> None:
        """Read what the catalog holds for the tenants and policies first seen in ``rows``."""
        view = self.view
        new_tenants = list(dict.fromkeys(r.tenant for r in rows if r.tenant not in view.tenants))
        if new_tenants:
            view.load_tenants(new_tenants)
        imported = []
        for key in dict.fromkeys((r.tenant, r.policy) for r in rows):
            if key not in self.policies:
                e = view.tenants[key[0]].get(key[1])
                if e is not None and e.newest is None and e.created_by == IMPORTED_BY:
                    imported.append(key)
        if imported:
            view.load_newest(imported)

    def _policy(self, t: str, p: str) -> _Policy:
        e = self.view.tenants[t].get(p)
        if e is None:
            pol = _Policy(None)
        elif e.retired_at is not None:
            pol = _Policy(e.base_model, f"policy {t}/{p} was retired at "
                          f"{e.retired_at:%Y-%m-%d %H:%M:%S}: nothing can be imported into it")  # fmt: skip
        elif e.created_by != IMPORTED_BY:
            pol = _Policy(e.base_model, f"policy {t}/{p} exists in the catalog, created by "
                          f"{e.created_by!r}, not by an import: its revision numbers come from "
                          "live registrations; import into a new policy")  # fmt: skip
        elif e.newest is not None and e.newest[1] != IMPORTED_BY:
            pol = _Policy(e.base_model, f"policy {t}/{p} has live registrations since it was "
                          f"imported (revision {e.newest[0]} by {e.newest[1]!r}): importing more "
                          "would race its compare-and-set numbering")  # fmt: skip
        else:
            pol = _Policy(e.base_model)
        self.policies[(t, p)] = pol
        return pol

    def check(self, row: ImportRow, line: int, out: RowSet, touched: dict) -> str | None:
        """None: accepted (its rows added to ``out``); ``_DUPLICATE``; else the reason."""
        t, p, n = row.tenant, row.policy, row.revision
        pol = self.policies.get((t, p)) or self._policy(t, p)
        if pol.refused:
            return pol.refused
        new_policy = pol.base_model is None
        if not new_policy and row.base_model != pol.base_model:
            return (f"base_model {row.base_model!r} differs from {pol.base_model!r}, the base "
                    f"model of {t}/{p}: a policy has one base model")  # fmt: skip
        created = _ms(row.created_at) if row.created_at is not None else self.default_created_ms
        fingerprint = hash((row.digest, row.uri, created, row.rank, tuple(row.aliases)))
        seen = pol.revs.get(n)
        if seen is not None:
            if seen[0] == fingerprint:
                return _DUPLICATE
            return (f"revision {n} of {t}/{p} is on line {seen[1]} with other content (digest, "
                    "uri, created_at, rank or aliases differ): one revision, one adapter")  # fmt: skip
        dh = hash(row.digest)
        other = pol.digests.get(dh)
        if other is not None:
            return (f"digest {row.digest} is revision {other} of {t}/{p} already (line "
                    f"{pol.revs[other][1]}): the same content cannot be two revisions")  # fmt: skip
        for a in row.aliases:
            claim = pol.aliases.get(a)
            if claim is not None:
                return (f"alias {a} of {t}/{p} already points at revision {claim[0]} (line "
                        f"{claim[1]}): an alias has one target")  # fmt: skip
        # Accepted.
        pol.revs[n] = (fingerprint, line)
        pol.digests[dh] = n
        if new_policy:
            pol.base_model = row.base_model
            out.policies.append((t, p, row.base_model, created))
            if t not in self.view.tenant_rows and t not in self.tenants_done:
                self.tenants_done.add(t)
                out.tenants.append((t, created))
        meta = "{}" if row.rank is None else f'{{"rank":{row.rank}}}'
        out.revisions.append((t, p, n, row.digest, row.uri, row.base_model, created, meta))
        for a in row.aliases:
            pol.aliases[a] = (n, line)
            out.aliases.append((t, p, a, n, row.digest, row.uri, created))
        if n > pol.latest:
            pol.latest = n
            touched[(t, p)] = n
        return None


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


def _validate(
    checker: _Checker, lines: list[tuple[int, bytes]]
) -> tuple[RowSet, list[tuple[int, str, bytes]], int, int]:
    """Validate and check a chunk: (rows to write, rejects in line order, accepted, duplicates)."""
    parsed: list[tuple[int, ImportRow, bytes]] = []
    rejects: list[tuple[int, str, bytes]] = []
    validate = ImportRow.model_validate_json
    for n, raw in lines:
        try:
            parsed.append((n, validate(raw), raw))
        except ValidationError as e:
            rejects.append((n, row_error(e), raw))
    checker.prepare([r for _, r, _ in parsed])
    out, touched = RowSet(), {}
    accepted = duplicates = 0
    check = checker.check
    for n, row, raw in parsed:
        reason = check(row, n, out, touched)
        if reason is None:
            accepted += 1
        elif reason is _DUPLICATE:
            duplicates += 1
        else:
            rejects.append((n, reason, raw))
    out.latest = [(t, p, latest) for (t, p), latest in touched.items()]
    rejects.sort(key=lambda r: r[0])
    return out, rejects, accepted, duplicates


def _reject_record(n: int, reason: str, raw: bytes) -> bytes:
    text = raw.decode("utf-8", errors="replace").rstrip("\r\n")
    rec = {"line": n, "reason": reason, "raw": text[:_RAW_KEPT]}
    if len(text) > _RAW_KEPT:
        rec["raw_truncated"] = True
    return (json.dumps(rec, ensure_ascii=False) + "\n").encode()


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


# ---------------------------------------------------------------------------- the import


def default_paths(path: Path) -> tuple[Path, Path]:
    """(state file, rejects file) beside the import file."""
    return path.with_name(path.name + ".import-state.json"), path.with_name(
        path.name + ".rejects.jsonl"
    )


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
    ident = _identity(path)
    state = None if restart else ImportState.load(state_path)
    if state is not None and state.keyspace != keyspace:
        raise Conflict(
            f"{state_path} is the checkpoint of an import of this file into keyspace "
            f"{state.keyspace!r}, not {keyspace!r}: pass another state file (--state) for "
            "another keyspace, or --restart to discard it"
        )
    if state is None:
        state = ImportState(keyspace, ident, datetime.now(UTC).isoformat())
    elif state.file != ident or state.completed_at is not None:
        if state.completed_at is None:
            log.warning("import file changed since its checkpoint: importing it from the start",
                        path=str(path), checkpoint_line=state.line)  # fmt: skip
        # A new pass over the whole file, with the first pass's start time (same rows).
        state = ImportState(keyspace, ident, state.started_at)
    started = datetime.fromisoformat(state.started_at)
    state.save(state_path)
    resumed_from = state.line
    total = ident["size"]

    view = _CatalogView(session, keyspace, concurrency)
    checker = _Checker(view, _ms(started))
    t_start = time.perf_counter()
    counts = state.counts
    reread_s = 0.0
    with _gc_tuned(), path.open("rb") as f:
        if state.offset:
            # Re-read (without writing) what the checkpoint covers, to know what it defined.
            for lines, end, _ in _chunks(f, 0, 0, chunk_rows, stop=state.offset):
                _validate(checker, lines)
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
                pool = ctx.Pool(workers, initializer=_init_writer,
                                initargs=(settings, keyspace, concurrency))  # fmt: skip
            else:
                writer = RowWriter(session, keyspace, by=IMPORTED_BY, concurrency=concurrency)
            result = _run(
                f, rejects, state, state_path, checker, writer, pool, chunk_rows,
                max(2, 2 * workers), total, on_progress, stop_after_chunks, t_start + reread_s,
            )  # fmt: skip
        finally:
            rejects.close()
            if pool is not None:
                pool.terminate()
                pool.join()
    written, accepted, complete = result
    if complete:
        state.completed_at = datetime.now(UTC).isoformat()
        state.save(state_path)
    seconds = time.perf_counter() - t_start - reread_s
    res = ImportResult(
        str(path), keyspace, complete, counts, round(seconds, 3), written, accepted,
        resumed_from, round(reread_s, 3), str(rejects_path), str(state_path), workers,
    )  # fmt: skip
    log.info("import finished" if complete else "import stopped", path=str(path),
             keyspace=keyspace, **asdict(counts), seconds=round(seconds, 2),
             rows_per_s=round(res.rows_per_s))  # fmt: skip
    return res


def _run(
    f, rejects, state, state_path, checker, writer, pool, chunk_rows, window, total, on_progress,
    stop_after_chunks, t0,
) -> tuple[int, int, bool]:  # fmt: skip
    counts = state.counts
    pending: deque[tuple[_Chunk, Any]] = deque()
    written = accepted = done = 0

    def finish(chunk: _Chunk, rows_written: int) -> None:
        nonlocal written, accepted, done
        rejects.flush()
        counts.lines += chunk.lines
        counts.accepted += chunk.accepted
        counts.duplicates += chunk.duplicates
        counts.rejected += chunk.rejected
        counts.rows_written += rows_written
        written += rows_written
        accepted += chunk.accepted
        done += 1
        state.offset, state.line = chunk.end_offset, chunk.end_line
        state.rejects_bytes = chunk.rejects_bytes
        state.save(state_path)
        if on_progress:
            rate = written / max(time.perf_counter() - t0, 1e-9)
            on_progress(ImportProgress(chunk.end_offset, total, counts, rate))

    def stop() -> bool:
        return stop_after_chunks is not None and done >= stop_after_chunks

    for lines, end, last in _chunks(f, state.offset, state.line, chunk_rows):
        rows, bad, ok, dups = _validate(checker, lines)
        for n, reason, raw in bad:
            rejects.write(_reject_record(n, reason, raw))
        chunk = _Chunk(rows, end, last, rejects.tell(), len(lines), ok, dups, len(bad))
        if pool is None:
            finish(chunk, writer.write(rows))
        else:
            pending.append((chunk, pool.apply_async(_write, (rows,))))
            while len(pending) >= window and not stop():
                c, r = pending.popleft()
                finish(c, r.get())
        if stop():
            return written, accepted, False
    while pending and not stop():
        c, r = pending.popleft()
        finish(c, r.get())
    return written, accepted, not pending
