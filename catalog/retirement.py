"""Retiring a policy and restoring it, and tagging a revision: facts recorded on their rows.

``PolicyRetirements`` is a part of ``CatalogRepository`` (mixed in, which prepares the
statements below), on ``CatalogBase`` (``base.py``: ``_run`` and the policy reads). A retired
policy takes no new revision and no alias move (``CatalogBase._live_policy``); its revisions and
aliases stay readable. Each write carries its event's time as the write timestamp (``USING
TIMESTAMP``): the same event twice writes the same cells, and of a retirement and a restore the
one that happened later wins in whatever order they arrive, so a catalog rebuilt from the log
equals the live one.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from catalog.base import CatalogBase
from catalog.models import Policy, utc

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

RETIREMENT_STATEMENTS = {
    "_retire_policy": (
        "UPDATE {ks}.policies USING TIMESTAMP ? SET retired_at = ?, retired_by = ? "
        "WHERE tenant = ? AND policy = ?"
    ),
    "_set_tags": (
        "UPDATE {ks}.revisions USING TIMESTAMP ? SET tags = ? "
        "WHERE tenant = ? AND policy = ? AND revision = ?"
    ),
    "_restore_policy": (
        "UPDATE {ks}.policies USING TIMESTAMP ? SET retired_at = null, retired_by = null "
        "WHERE tenant = ? AND policy = ?"
    ),
}


class PolicyRetirements(CatalogBase):
    """The retirement half of ``CatalogRepository``."""

    def set_retired(
        self,
        tenant: str,
        policy: str,
        *,
        retired: bool,
        at: datetime,
        by: str = "",
    ) -> Policy:
        """Record that the policy was retired at ``at`` by ``by`` (``retired`` False: restored
        at ``at``), names as decoded from an event. Refused with PolicyNotFound for a policy
        the catalog lacks (an update would create a row with no base model). Returns the
        policy as it reads afterwards (a later event of the policy may already have won)."""
        self._read_policy(tenant, policy)
        at = utc(at)
        # Microseconds since the epoch: the event's time orders writes, never the wall clock.
        stamp = (at - _EPOCH) // timedelta(microseconds=1)
        if retired:
            self._run(self._retire_policy, (stamp, at, by, tenant, policy))
        else:
            self._run(self._restore_policy, (stamp, tenant, policy))
        return self._read_policy(tenant, policy)

    def set_tags(self, tenant: str, policy: str, revision: int, tags: list[str], *, at) -> None:
        """Record a ``revision.tagged`` fact: the revision's tags are ``tags`` as of ``at`` (the
        event's time orders the writes, as for a retirement). RevisionNotFound: no such one."""
        self._read_revision(tenant, policy, revision)
        stamp = (utc(at) - _EPOCH) // timedelta(microseconds=1)
        self._run(self._set_tags, (stamp, set(tags) or None, tenant, policy, revision))
