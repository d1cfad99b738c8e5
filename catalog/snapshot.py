"""Dump a catalog keyspace to comparable rows and diff two keyspaces (live vs rebuilt)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from cassandra.cluster import Session
from cassandra.query import SimpleStatement

from catalog.tables import CATALOG

# Every catalog table; schema_migrations is bookkeeping of the keyspace, not catalog content.
TABLES = CATALOG


def dump(
    session: Session, keyspace: str, tables=TABLES, tenant: str | None = None
) -> dict[str, set[tuple]]:
    """Each table as a set of rows (tuples of (column, value) sorted by column), optionally only
    one tenant's rows (every catalog table has a tenant column)."""
    out = {}
    for table in tables:
        stmt = SimpleStatement(f"SELECT * FROM {keyspace}.{table}", fetch_size=5000)
        out[table] = {
            tuple(sorted((k, _hashable(v)) for k, v in r._asdict().items()))
            for r in session.execute(stmt)
            if tenant is None or r.tenant == tenant
        }
    return out


def _hashable(value):
    """A collection column (map, list, set) as a comparable tuple; other values as read."""
    if isinstance(value, Mapping):
        return tuple(sorted(value.items()))
    if isinstance(value, (list, set, frozenset, tuple)) or type(value).__name__ == "SortedSet":
        return tuple(value)
    return value


@dataclass
class Diff:
    tables: dict[str, tuple[int, int, int]] = field(default_factory=dict)  # rows, only_a, only_b
    examples: dict[str, list[str]] = field(default_factory=dict)

    @property
    def identical(self) -> bool:
        return all(a == 0 and b == 0 for _, a, b in self.tables.values())

    def summary(self) -> str:
        lines = [
            f"{t}: {n} rows, {a} only in first, {b} only in second"
            for t, (n, a, b) in self.tables.items()
        ]
        for t, ex in self.examples.items():
            lines += [f"  {t}: {e}" for e in ex]
        return "\n".join(lines)


def compare(
    session: Session, keyspace_a: str, keyspace_b: str, tables=TABLES, tenant: str | None = None
) -> Diff:
    a = dump(session, keyspace_a, tables, tenant)
    b = dump(session, keyspace_b, tables, tenant)
    diff = Diff()
    for t in tables:
        only_a, only_b = a[t] - b[t], b[t] - a[t]
        diff.tables[t] = (len(a[t]), len(only_a), len(only_b))
        ex = [f"only in {keyspace_a}: {dict(r)}" for r in list(only_a)[:3]]
        ex += [f"only in {keyspace_b}: {dict(r)}" for r in list(only_b)[:3]]
        if ex:
            diff.examples[t] = ex
    return diff
