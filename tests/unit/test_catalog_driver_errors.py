"""A cluster that is down (every node restarting) reaches workers as CatalogUnavailable, the
transient error the consumer loop waits out: found by benchmarks/fault_injection.py, where a
Cassandra restart dead-lettered a training update (NoHostAvailable is no DriverException)."""

from __future__ import annotations

import pytest
from cassandra import OperationTimedOut
from cassandra.cluster import NoHostAvailable

from catalog.exceptions import CatalogUnavailable
from catalog.repository import CatalogRepository
from catalog.state import StateTable
from streams.consumer import is_transient


class DownSession:
    def __init__(self, error: Exception) -> None:
        self.error = error

    def prepare(self, cql: str):
        class Stmt:
            consistency_level = serial_consistency_level = None

        return Stmt()

    def execute(self, *args, **kwargs):
        raise self.error


ERRORS = [NoHostAvailable("Unable to complete the operation against any hosts", {}),
          OperationTimedOut("no answer")]  # fmt: skip


@pytest.mark.parametrize("error", ERRORS, ids=lambda e: type(e).__name__)
def test_driver_errors_become_catalog_unavailable_and_are_transient(error) -> None:
    repo = CatalogRepository.__new__(CatalogRepository)
    repo.session, repo.keyspace = DownSession(error), "ks"
    with pytest.raises(CatalogUnavailable) as caught:
        repo._run(object(), ())
    assert is_transient(caught.value)
    state = StateTable.__new__(StateTable)
    state.session, state.name, state.keyspace = DownSession(error), "w", "ks"
    with pytest.raises(CatalogUnavailable) as caught:
        state._run(object(), ())
    assert is_transient(caught.value)
