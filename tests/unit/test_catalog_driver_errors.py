"""Cassandra driver errors sorted into the two kinds the consumer loop acts on.

A cluster that is down (every node restarting) reaches workers as CatalogUnavailable, the
transient error the loop waits out: found by benchmarks/fault_injection.py, where a Cassandra
restart dead-lettered a training update (NoHostAvailable is no DriverException). A statement that
Cassandra answers and refuses (a missing grant, a table that was never migrated, bad CQL) is no
outage: it was waited out forever with /readyz at 503 (issue 25, defect 10); it is now
CatalogRefused/CatalogUnauthorized, which the loop dead-letters at once and a start-up raises.
"""

from __future__ import annotations

import pytest
from cassandra import (
    AlreadyExists,
    ConfigurationException,
    InvalidRequest,
    OperationTimedOut,
    ReadFailure,
    ReadTimeout,
    Unauthorized,
    Unavailable,
    WriteTimeout,
)
from cassandra.cluster import NoHostAvailable
from cassandra.connection import ConnectionShutdown
from cassandra.protocol import ErrorMessage, SyntaxException
from cassandra.query import SimpleStatement

from catalog.access import AccessRepository
from catalog.exceptions import (
    CatalogError,
    CatalogRefused,
    CatalogUnauthorized,
    CatalogUnavailable,
)
from catalog.repository import CatalogRepository
from catalog.state import StateTable
from streams.exceptions import is_refusal
from streams.records import is_transient

CQL = "INSERT INTO ks.worker_state (name, key, value, updated_at) VALUES (?, ?, ?, ?)"


class DownSession:
    """A session whose every request (and, with ``on_prepare``, every prepare) fails."""

    def __init__(self, error: Exception, on_prepare: bool = False) -> None:
        self.error, self.on_prepare = error, on_prepare

    def prepare(self, cql: str):
        if self.on_prepare:
            raise self.error
        return SimpleStatement(cql)  # stands in for the PreparedStatement (same query_string)

    def execute(self, *args, **kwargs):
        raise self.error


ERRORS = [
    NoHostAvailable("Unable to complete the operation against any hosts", {}),
    OperationTimedOut("no answer"),
]


@pytest.mark.parametrize("error", ERRORS, ids=lambda e: type(e).__name__)
def test_driver_errors_become_catalog_unavailable_and_are_transient(error) -> None:
    repo = _repo(DownSession(error))
    with pytest.raises(CatalogUnavailable) as caught:
        repo._cql.run(object(), ())
    assert is_transient(caught.value)
    state = _state(DownSession(error))
    with pytest.raises(CatalogUnavailable) as caught:
        state._cql.run(object(), ())
    assert is_transient(caught.value)


UNAUTHORIZED = (
    "User trainer has no MODIFY permission on <table ks.worker_state> or any of its parents"
)
# (driver error, the catalog error it becomes). Transient: unavailable, timed out, no host,
# connection dropped. Everything else Cassandra answers with is a refusal.
SORTED = [
    (NoHostAvailable("Unable to complete the operation against any hosts", {}), CatalogUnavailable),
    (
        Unavailable(
            "Cannot achieve consistency", consistency=6, required_replicas=2, alive_replicas=1
        ),
        CatalogUnavailable,
    ),
    (ReadTimeout("Operation timed out"), CatalogUnavailable),
    (WriteTimeout("Operation timed out", write_type=0), CatalogUnavailable),
    (OperationTimedOut("errors={}, last_host=10.0.0.1"), CatalogUnavailable),
    (  # CAS_WRITE_UNKNOWN, met by the cluster smoke while a killed node came back
        ErrorMessage(
            0x1700,
            "CAS operation result is unknown - proposal accepted by 1 but not a quorum.",
            None,
        ),
        CatalogUnavailable,
    ),
    (ConnectionShutdown("Connection to 10.0.0.1 was closed"), CatalogUnavailable),
    (Unauthorized(UNAUTHORIZED), CatalogUnauthorized),
    (InvalidRequest("unconfigured table worker_state"), CatalogRefused),
    (ConfigurationException("Keyspace ks doesn't exist"), CatalogRefused),
    (AlreadyExists(keyspace="ks", table="worker_state"), CatalogRefused),
    (
        SyntaxException(8192, "line 1:0 no viable alternative at input 'INSRT'", None),
        CatalogRefused,
    ),
    (ReadFailure("Operation failed - received 0 responses and 1 failures"), CatalogRefused),
]


# Built as the workers build them (their statements prepare; every request fails): each runs
# its statements through catalog.cluster.Statements, the one place driver errors are sorted.
def _state(session: DownSession) -> StateTable:
    return StateTable(session, "ks", "controller.lifecycle")  # type: ignore[arg-type]


def _repo(session: DownSession) -> CatalogRepository:
    return CatalogRepository(session, "ks")  # type: ignore[arg-type]


def _access(session: DownSession) -> AccessRepository:
    return AccessRepository(session, "ks")  # type: ignore[arg-type]


@pytest.mark.parametrize("make", [_state, _repo, _access], ids=["state", "repository", "access"])
@pytest.mark.parametrize(("error", "becomes"), SORTED, ids=lambda x: type(x).__name__)
def test_each_driver_error_is_transient_or_a_refusal(make, error, becomes) -> None:
    target = make(DownSession(error))
    stmt = DownSession(error).prepare(CQL)
    with pytest.raises(CatalogError) as caught:
        target._cql.run(stmt, ())
    got = caught.value
    assert type(got) is becomes and got.__cause__ is error
    assert is_transient(got) is (becomes is CatalogUnavailable)
    assert is_refusal(got) is (becomes is not CatalogUnavailable)  # dead-lettered at once
    assert "INSERT INTO ks.worker_state" in str(got) and "keyspace 'ks'" in str(got)


def test_a_missing_grant_names_the_permission_and_what_to_do() -> None:
    with pytest.raises(CatalogUnauthorized) as caught:
        _state(DownSession(Unauthorized(UNAUTHORIZED)))._cql.run(DownSession(None).prepare(CQL), ())
    message = str(caught.value)
    assert "no MODIFY permission on <table ks.worker_state>" in message
    assert "Grant the permission" in message and "retrying cannot help" in message
    assert isinstance(caught.value, PermissionError) and isinstance(caught.value, CatalogRefused)


def test_a_statement_refused_at_start_up_fails_naming_it() -> None:
    """A worker built on a keyspace that was never migrated stops at once, naming the statement
    (prepare is where Cassandra says "unconfigured table"), instead of waiting for ever."""
    session = DownSession(InvalidRequest("unconfigured table worker_state"), on_prepare=True)
    with pytest.raises(CatalogRefused, match="mint catalog migrate") as caught:
        StateTable(session, "ks", "controller.lifecycle")  # type: ignore[arg-type]
    assert "SELECT value FROM ks.worker_state" in str(caught.value)
    assert "unconfigured table worker_state" in str(caught.value)
    with pytest.raises(CatalogUnavailable):  # a cluster that is away at start-up: an outage
        StateTable(DownSession(OperationTimedOut("x"), on_prepare=True), "ks", "w")  # type: ignore[arg-type]
