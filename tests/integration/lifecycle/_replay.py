"""The check that the catalog is a projection of the log (shared by lifecycle tests)."""

from __future__ import annotations


def assert_catalog_equals_replay(settings, session) -> None:
    """Rebuild the catalog from the log into an empty keyspace: every catalog table identical
    (catalog.rebuild.replay_differences)."""
    from catalog.rebuild import replay_differences
    from workers.projector import read_log

    problems = replay_differences(session, settings, read_log(settings))
    assert not problems, problems
