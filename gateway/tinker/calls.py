"""What names a Tinker call and a training model: the call's identity across the SDK's re-sends
(:class:`CallKey`), a model and its policy (``<session>:train:<n>`` is policy
``<session>-<n>`` of the caller's tenant), and the bounded caches an instance keeps of them."""

from __future__ import annotations

import secrets
import uuid
from dataclasses import dataclass
from typing import Any, TypeVar

from gateway.tinker.bodies import MODEL_ID

MAX_REMEMBERED = 100_000  # models and saved states one instance keeps in memory
CALLS = uuid.UUID("6d696e74-7469-6e6b-6572-63616c6c7300")  # the namespace of call event ids
V = TypeVar("V")


@dataclass(frozen=True)
class Model:
    """A training model of a tenant: its policy and what create_model said about it."""

    model_id: str
    policy: str
    base_model: str
    rank: int | None = None
    train_attn: bool = True
    train_mlp: bool = True


@dataclass(frozen=True)
class CallKey:
    """What makes a Tinker call the same call when the SDK sends it again: its idempotency key
    (``X-Idempotency-Key``, one per call and kept across the SDK's retries) with its ``seq_id``.
    The ``seq_id`` alone is not enough: it restarts at 1 in each training client of a model."""

    idempotency_key: str
    seq_id: int | None = None

    @classmethod
    def of(cls, idempotency_key: str | None, seq_id: int | None) -> CallKey | None:
        return cls(idempotency_key[:200], seq_id) if idempotency_key else None

    def event_id(self, tenant: str, model_id: str, op: str) -> uuid.UUID:
        """The command's event id: the same for every copy of the call, so the trainer (which
        answers an event id it has seen from memory) never applies it twice."""
        parts = (tenant, model_id, op, str(self.seq_id), self.idempotency_key)
        return uuid.uuid5(CALLS, "\x1f".join(parts))


def name_suffix(call: CallKey | None, nbytes: int) -> str:
    """A default checkpoint name's random part: the same for each copy of one call."""
    if call is None:
        return secrets.token_hex(nbytes)
    return uuid.uuid5(CALLS, call.idempotency_key).hex[: 2 * nbytes]


def policy_of(model_id: str) -> str | None:
    found = MODEL_ID.match(model_id)
    return f"{found['session']}-{int(found['seq'])}" if found else None


def remember(table: dict[Any, V], key: Any, value: V, limit: int = MAX_REMEMBERED) -> V:
    """``table[key] = value``, the oldest entry dropped past ``limit`` (a cache: what is
    dropped is read again from the shared rows)."""
    table.pop(key, None)
    table[key] = value
    while len(table) > limit:
        del table[next(iter(table))]
    return value
