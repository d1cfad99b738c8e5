"""The check that the catalog is a projection of the log (shared by lifecycle tests)."""

from __future__ import annotations


def assert_catalog_equals_replay(settings, session) -> None:
    """Rebuild the catalog from the log into an empty keyspace: every catalog table identical;
    ``applied_events`` (dedup bookkeeping) holds the same events, only its type label differs
    where the trainer registered a revision before announcing it (``revision.registered``)."""
    from catalog.rebuild import rebuild
    from catalog.snapshot import TABLES, compare, dump
    from workers.projector import read_log

    target = f"{settings.keyspace}_rb"
    report = rebuild(session, target, settings.keyspace_replication, read_log(settings))
    assert report.outcomes["failed"] == 0, report.failures
    content = tuple(t for t in TABLES if t != "applied_events")
    diff = compare(session, settings.keyspace, target, tables=content)
    assert diff.identical, diff.summary()

    def applied(ks: str) -> set[tuple]:
        rows = dump(session, ks, ("applied_events",))["applied_events"]
        return {tuple(v for k, v in r if k not in ("type", "outcome")) for r in rows}

    assert applied(settings.keyspace) == applied(target)
