"""Versioned schema migrations: ``catalog/migrations/NNNN_name.cql`` applied in order, each
recorded in ``schema_migrations`` with its checksum. Re-running is a no-op; a migration file that
changed after it was applied is an error (write a new migration instead)."""

from __future__ import annotations

import hashlib
import re
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import structlog
from cassandra import DriverException
from cassandra.cluster import Session

from catalog.cluster import ensure_keyspace
from catalog.exceptions import MigrationError

MIGRATIONS_DIR = Path(__file__).parent / "migrations"
_FILE = re.compile(r"^(\d{4})_([a-z0-9_]+)\.cql$")
_KEYSPACE = re.compile(r"^[a-z][a-z0-9_]{0,47}$")

log = structlog.get_logger()


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    statements: tuple[str, ...]
    checksum: str


def load_migrations(directory: Path = MIGRATIONS_DIR) -> list[Migration]:
    found = []
    for path in sorted(directory.glob("*.cql")):
        m = _FILE.match(path.name)
        if not m:
            raise MigrationError(
                f"migration file {path.name!r} is not named NNNN_lower_snake.cql: rename it"
            )
        text = path.read_text()
        # Strip `--` comments, then split on `;` (our CQL has no semicolons inside literals).
        body = "\n".join(line.split("--", 1)[0] for line in text.splitlines())
        stmts = tuple(s.strip() for s in body.split(";") if s.strip())
        found.append(
            Migration(int(m.group(1)), m.group(2), stmts, hashlib.sha256(text.encode()).hexdigest())
        )
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions):
        raise MigrationError(f"duplicate migration versions in {directory}: {versions}")
    return found


def migrate(
    session: Session,
    keyspace: str,
    replication: str,
    directory: Path = MIGRATIONS_DIR,
) -> list[int]:
    """Create the keyspace if needed and apply pending migrations; returns versions applied now."""
    if not _KEYSPACE.match(keyspace):
        raise MigrationError(
            f"keyspace {keyspace!r} must match {_KEYSPACE.pattern} (lowercase, digits, underscore)"
        )
    try:
        ensure_keyspace(session, keyspace, replication)
        session.execute(
            f"CREATE TABLE IF NOT EXISTS {keyspace}.schema_migrations ("
            "version int PRIMARY KEY, name text, checksum text, applied_at timestamp)"
        )
        done = {
            r.version: r.checksum
            for r in session.execute(f"SELECT version, checksum FROM {keyspace}.schema_migrations")
        }
    except DriverException as e:
        raise MigrationError(f"cannot prepare keyspace {keyspace!r}: {e}") from e
    applied = []
    for mig in load_migrations(directory):
        if mig.version in done:
            if done[mig.version] != mig.checksum:
                raise MigrationError(
                    f"migration {mig.version:04d}_{mig.name} was changed after it was applied to "
                    f"{keyspace!r} (checksum {done[mig.version][:12]} != {mig.checksum[:12]}): "
                    "restore the file and add a new migration for the change"
                )
            continue
        t0 = time.perf_counter()
        for stmt in mig.statements:
            try:
                session.execute(stmt.format(keyspace=keyspace), timeout=60)
            except DriverException as e:
                raise MigrationError(
                    f"migration {mig.version:04d}_{mig.name} failed on {keyspace!r}: {e}\n{stmt}"
                ) from e
        session.execute(
            f"INSERT INTO {keyspace}.schema_migrations (version, name, checksum, applied_at) "
            "VALUES (%s, %s, %s, %s)",
            (mig.version, mig.name, mig.checksum, datetime.now(UTC)),
        )
        log.info(
            "migration applied",
            keyspace=keyspace,
            version=mig.version,
            name=mig.name,
            seconds=round(time.perf_counter() - t0, 2),
        )
        applied.append(mig.version)
    return applied


def applied_versions(session: Session, keyspace: str) -> list[int]:
    rows = session.execute(f"SELECT version FROM {keyspace}.schema_migrations")
    return sorted(r.version for r in rows)
