"""What the Tinker API's gateway instances share (migration 8): training models, futures, the
calls the SDK may send again, and saved states, each row under its tenant's partition key.

Plain values in and out (the gateway turns its outcomes into the ``outcome`` JSON and ``proto``
bytes): the catalog knows nothing of the API. Writes are idempotent overwrites, so that every
instance that hears a trainer's answer may record it; reads are one partition each.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from cassandra.cluster import Session

from catalog.cluster import Statements


@dataclass(frozen=True)
class ModelRecord:
    """A training model of a tenant, as ``create_model`` described it."""

    model_id: str
    policy: str
    base_model: str
    rank: int | None
    train_attn: bool
    train_mlp: bool


@dataclass(frozen=True)
class FutureRecord:
    """A call's future: pending while ``outcome`` and ``proto`` are both None."""

    request_id: str
    kind: str
    context: str  # JSON: what the answer needs (model id, checkpoint name, ...)
    created_at: datetime
    outcome: str | None = None  # JSON
    proto: bytes | None = None
    lease_until: datetime | None = None  # a sample: its runner's lease


_STATEMENTS = {
    "_ins_model": (
        "INSERT INTO {ks}.tinker_models (tenant, policy, model_id, base_model, lora_rank, "
        "train_attn, train_mlp, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
    ),
    "_get_model": (
        "SELECT model_id, base_model, lora_rank, train_attn, train_mlp FROM {ks}.tinker_models "
        "WHERE tenant = ? AND policy = ?"
    ),
    "_ins_future": (
        "INSERT INTO {ks}.tinker_futures (tenant, request_id, kind, context, created_at, "
        "lease_until) VALUES (?, ?, ?, ?, ?, ?)"
    ),
    "_renew": (
        "UPDATE {ks}.tinker_futures SET lease_until = ? WHERE tenant = ? AND request_id = ?"
    ),
    "_set_outcome": (
        "UPDATE {ks}.tinker_futures SET outcome = ?, proto = ?, kind = ?, context = ?, "
        "created_at = ? WHERE tenant = ? AND request_id = ?"
    ),
    "_get_future": (
        "SELECT kind, context, created_at, outcome, proto, lease_until FROM {ks}.tinker_futures "
        "WHERE tenant = ? AND request_id = ?"
    ),
    "_ins_call": ("INSERT INTO {ks}.tinker_calls (tenant, event_id, request_id) VALUES (?, ?, ?)"),
    "_get_call": "SELECT request_id FROM {ks}.tinker_calls WHERE tenant = ? AND event_id = ?",
    "_ins_state": (
        "INSERT INTO {ks}.tinker_states (tenant, path, uri, saved_at) VALUES (?, ?, ?, ?)"
    ),
    "_get_state": "SELECT uri FROM {ks}.tinker_states WHERE tenant = ? AND path = ?",
}
_CONDITIONAL = {
    "_claim": (
        "UPDATE {ks}.tinker_futures SET lease_until = ? WHERE tenant = ? AND request_id = ? "
        "IF lease_until = ?"
    ),
}


class TinkerCalls:
    """The shared Tinker rows of one keyspace. Thread-safe (the driver session is)."""

    def __init__(self, session: Session, keyspace: str) -> None:
        self._cql = Statements(session, keyspace)
        self._cql.prepare_table(self, _STATEMENTS, fields={"ks": keyspace})
        self._cql.prepare_table(self, _CONDITIONAL, fields={"ks": keyspace}, serial=True)

    def _one(self, stmt: Any, params: tuple) -> Any:
        return self._cql.run(stmt, params).one()

    # models

    def add_model(self, tenant: str, m: ModelRecord) -> None:
        row = (m.model_id, m.base_model, m.rank, m.train_attn, m.train_mlp, _now())
        self._cql.run(self._ins_model, (tenant, m.policy, *row))

    def model(self, tenant: str, policy: str) -> ModelRecord | None:
        row = self._one(self._get_model, (tenant, policy))
        if row is None:
            return None
        return ModelRecord(
            row.model_id,
            policy,
            row.base_model,
            row.lora_rank,
            bool(row.train_attn),
            bool(row.train_mlp),
        )

    # futures and calls

    def add_future(self, tenant: str, f: FutureRecord) -> None:
        row = (f.kind, f.context, f.created_at, f.lease_until)
        self._cql.run(self._ins_future, (tenant, f.request_id, *row))

    def renew(self, tenant: str, request_id: str, until: datetime) -> None:
        """The runner of a sample still runs it, until ``until``."""
        self._cql.run(self._renew, (until, tenant, request_id))

    def claim(self, tenant: str, request_id: str, seen: datetime, until: datetime) -> bool:
        """Take over a sample whose lease (``seen``, as read) ran out: True for one taker."""
        return bool(self._cql.run(self._claim, (until, tenant, request_id, seen)).was_applied)

    def settle(self, tenant: str, f: FutureRecord) -> None:
        """Record a future's outcome (its other columns again: the TTL restarts for all)."""
        params = (f.outcome, f.proto, f.kind, f.context, f.created_at, tenant, f.request_id)
        self._cql.run(self._set_outcome, params)

    def future(self, tenant: str, request_id: str) -> FutureRecord | None:
        row = self._one(self._get_future, (tenant, request_id))
        if row is None or row.kind is None:
            return None
        created = row.created_at.replace(tzinfo=UTC) if row.created_at else _now()
        lease = row.lease_until.replace(tzinfo=UTC) if row.lease_until else None
        context = row.context or "{}"
        return FutureRecord(request_id, row.kind, context, created, row.outcome, row.proto, lease)

    def add_call(self, tenant: str, event_id: Any, request_id: str) -> None:
        self._cql.run(self._ins_call, (tenant, event_id, request_id))

    def call(self, tenant: str, event_id: Any) -> str | None:
        row = self._one(self._get_call, (tenant, event_id))
        return None if row is None else row.request_id

    # saved states

    def add_state(self, tenant: str, path: str, uri: str) -> None:
        self._cql.run(self._ins_state, (tenant, path, uri, _now()))

    def state(self, tenant: str, path: str) -> str | None:
        row = self._one(self._get_state, (tenant, path))
        return None if row is None else row.uri


def _now() -> datetime:
    return datetime.now(UTC)
