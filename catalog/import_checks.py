"""The checks of an import's rows that need more than the row (catalog/importer.py): what the
catalog holds for their policies, and what the lines before them defined (one content per
revision number, one revision per digest, one target per alias, one base model per policy)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from cassandra.cluster import Session
from cassandra.concurrent import execute_concurrent_with_args
from pydantic import ValidationError

from catalog.bulk import RowSet
from catalog.cluster import DRIVER_ERRORS, Statements, driver_error
from catalog.import_rows import ImportRow, epoch_ms, row_error

IMPORTED_BY = "import"

_STATEMENTS = {
    "_policies": (
        "SELECT policy, base_model, created_by, retired_at FROM {ks}.policies WHERE tenant = ?"
    ),
    "_tenant": "SELECT tenant FROM {ks}.tenants WHERE tenant = ?",
    "_newest": (
        "SELECT revision, created_by FROM {ks}.revisions WHERE tenant = ? AND policy = ? LIMIT 1"
    ),
}


@dataclass(frozen=True)
class _Existing:
    base_model: str
    created_by: str
    retired_at: datetime | None
    newest: tuple[int, str] | None = None  # newest revision and its creator, read when needed


class CatalogView:
    """What the catalog holds before the import touches a tenant: its policies (one partition
    read per tenant) and, for policies an earlier import created, their newest revision."""

    def __init__(self, session: Session, keyspace: str, concurrency: int) -> None:
        self.session, self.keyspace, self.concurrency = session, keyspace, concurrency
        Statements(session, keyspace).prepare_table(
            self, _STATEMENTS, fields={"ks": keyspace}, fetch_size=5000
        )
        self.tenants: dict[str, dict[str, _Existing]] = {}
        self.tenant_rows: set[str] = set()

    def _run(self, stmt, args: list[tuple]) -> list:
        doing = f"read of keyspace {self.keyspace!r}"
        then = "then re-run the import (it resumes from its checkpoint)"
        results = execute_concurrent_with_args(
            self.session, stmt, args, concurrency=self.concurrency, raise_on_first_error=False
        )
        out = []
        for ok, value in results:
            if not ok:
                raise driver_error(value, doing, stmt, then) from value
            try:
                out.append(list(value))  # further pages are fetched here
            except DRIVER_ERRORS as e:
                raise driver_error(e, doing, stmt, then) from e
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


DUPLICATE = "duplicate"


class Checker:
    """The checks that need what came before a line: in file order, so a resumed import that
    re-reads the lines before its checkpoint decides every line the same way."""

    def __init__(self, view: CatalogView, default_created_ms: int) -> None:
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
            pol = _Policy(
                e.base_model,
                f"policy {t}/{p} was retired at "
                f"{e.retired_at:%Y-%m-%d %H:%M:%S}: nothing can be imported into it",
            )
        elif e.created_by != IMPORTED_BY:
            pol = _Policy(
                e.base_model,
                f"policy {t}/{p} exists in the catalog, created by "
                f"{e.created_by!r}, not by an import: its revision numbers come from "
                "live registrations; import into a new policy",
            )
        elif e.newest is not None and e.newest[1] != IMPORTED_BY:
            pol = _Policy(
                e.base_model,
                f"policy {t}/{p} has live registrations since it was "
                f"imported (revision {e.newest[0]} by {e.newest[1]!r}): importing more "
                "would race its compare-and-set numbering",
            )
        else:
            pol = _Policy(e.base_model)
        self.policies[(t, p)] = pol
        return pol

    def check(self, row: ImportRow, line: int, out: RowSet, touched: dict) -> str | None:
        """None: accepted (its rows added to ``out``); ``DUPLICATE``; else the reason."""
        t, p, n = row.tenant, row.policy, row.revision
        pol = self.policies.get((t, p)) or self._policy(t, p)
        if pol.refused:
            return pol.refused
        new_policy = pol.base_model is None
        if not new_policy and row.base_model != pol.base_model:
            return (
                f"base_model {row.base_model!r} differs from {pol.base_model!r}, the base "
                f"model of {t}/{p}: a policy has one base model"
            )
        created = (
            epoch_ms(row.created_at) if row.created_at is not None else self.default_created_ms
        )
        fingerprint = hash((row.digest, row.uri, created, row.rank, tuple(row.aliases)))
        seen = pol.revs.get(n)
        if seen is not None:
            if seen[0] == fingerprint:
                return DUPLICATE
            return (
                f"revision {n} of {t}/{p} is on line {seen[1]} with other content (digest, "
                "uri, created_at, rank or aliases differ): one revision, one adapter"
            )
        dh = hash(row.digest)
        other = pol.digests.get(dh)
        if other is not None:
            return (
                f"digest {row.digest} is revision {other} of {t}/{p} already (line "
                f"{pol.revs[other][1]}): the same content cannot be two revisions"
            )
        for a in row.aliases:
            claim = pol.aliases.get(a)
            if claim is not None:
                return (
                    f"alias {a} of {t}/{p} already points at revision {claim[0]} (line "
                    f"{claim[1]}): an alias has one target"
                )
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


def check_chunk(
    checker: Checker, lines: list[tuple[int, bytes]]
) -> tuple[RowSet, list[tuple[int, str, bytes]], int, int]:
    """Validate and check a chunk: (rows to write, rejects in line order, accepted, duplicates)."""
    parsed: list[tuple[int, ImportRow, bytes]] = []
    rejects: list[tuple[int, str, bytes]] = []
    parse = ImportRow.model_validate_json
    for n, raw in lines:
        try:
            parsed.append((n, parse(raw), raw))
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
        elif reason is DUPLICATE:
            duplicates += 1
        else:
            rejects.append((n, reason, raw))
    out.latest = [(t, p, latest) for (t, p), latest in touched.items()]
    rejects.sort(key=lambda r: r[0])
    return out, rejects, accepted, duplicates
