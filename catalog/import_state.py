"""An import's counts, its result, and its checkpoint (``FILE.import-state.json``) that makes a
killed import resumable (catalog/importer.py)."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import structlog

from catalog.exceptions import Conflict

log = structlog.get_logger()

STATE_VERSION = 1


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


def file_identity(path: Path) -> dict[str, Any]:
    st = path.stat()
    with path.open("rb") as f:
        head = hashlib.sha256(f.read(1 << 16)).hexdigest()
    return {
        "path": str(path.resolve()),
        "size": st.st_size,
        "mtime_ns": st.st_mtime_ns,
        "head_sha256": head,
    }


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
    def resume(cls, state_path: Path, keyspace: str, path: Path, *, restart: bool) -> ImportState:
        """The checkpoint an import of ``path`` continues from, saved: the one in
        ``state_path``; a new pass over the whole file (with the first pass's start time, so
        undated rows get the same time) when the file changed or was imported completely; a
        fresh one when there is none or ``restart``. Refuses the checkpoint of another keyspace."""
        ident = file_identity(path)
        state = None if restart else cls.load(state_path)
        if state is not None and state.keyspace != keyspace:
            raise Conflict(
                f"{state_path} is the checkpoint of an import of this file into keyspace "
                f"{state.keyspace!r}, not {keyspace!r}: pass another state file (--state) for "
                "another keyspace, or --restart to discard it"
            )
        if state is None:
            state = cls(keyspace, ident, datetime.now(UTC).isoformat())
        elif state.file != ident or state.completed_at is not None:
            if state.completed_at is None:
                log.warning(
                    "import file changed since its checkpoint: importing it from the start",
                    path=str(path),
                    checkpoint_line=state.line,
                )
            state = cls(keyspace, ident, state.started_at)
        state.save(state_path)
        return state

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


def default_paths(path: Path) -> tuple[Path, Path]:
    """(state file, rejects file) beside the import file."""
    return path.with_name(path.name + ".import-state.json"), path.with_name(
        path.name + ".rejects.jsonl"
    )
