"""Evaluation results per revision: the latest ``eval.completed`` of each (revision, suite).

``RevisionEvaluations`` is a part of ``CatalogRepository`` (mixed in, which prepares the
statements below), on ``CatalogBase`` (``base.py``: ``_run`` and the revision reads). A result is
written with its event's time as the write timestamp (``USING TIMESTAMP``): the same event
twice writes the same cells, and of two results for one suite the one that happened later wins
in whatever order they arrive, so a catalog rebuilt from the log equals the live one.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from catalog.base import CatalogBase
from catalog.exceptions import Conflict
from catalog.models import Evaluation, from_row, utc
from catalog.refs import check_name, check_revision

EVALUATION_FIELDS = {
    "evaluation_cols": "tenant, policy, revision, suite, digest, metrics, thresholds, passed, "
    "failures, refused, evaluated_at, evaluated_by, event_id",
}
EVALUATION_STATEMENTS = {
    "_ins_evaluation": (
        "INSERT INTO {ks}.revision_evaluations ({evaluation_cols}) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) USING TIMESTAMP ?"
    ),
    "_list_evaluations": (
        "SELECT {evaluation_cols} FROM {ks}.revision_evaluations WHERE tenant = ? AND policy = ?"
    ),
    "_revision_evaluations": (
        "SELECT {evaluation_cols} FROM {ks}.revision_evaluations "
        "WHERE tenant = ? AND policy = ? AND revision = ?"
    ),
}


class RevisionEvaluations(CatalogBase):
    """The evaluation half of ``CatalogRepository``."""

    def record_evaluation(
        self,
        tenant: str,
        policy: str,
        revision: int,
        *,
        digest: str,
        suite: str,
        metrics: Mapping[str, float],
        thresholds: Mapping[str, Any],
        passed: bool,
        failures: Sequence[str],
        refused: str | None,
        at: datetime,
        by: str = "",
        event_id: uuid.UUID | None = None,
    ) -> Evaluation:
        """Record a revision's result on ``suite`` (names as decoded from an event). Refused
        with RevisionNotFound for a revision the catalog lacks, and Conflict when ``digest`` is
        not the revision's: the result is of another adapter than the catalog's."""
        rev = self._read_revision(tenant, policy, revision)
        if rev.digest != digest:
            raise Conflict(
                f"eval.completed of {tenant}/{policy}@{revision} on suite {suite!r} names digest "
                f"{digest}, the catalog's revision {revision} has {rev.digest}: the result is of "
                "another adapter (or the catalog was built from another log); not recorded"
            )
        at = utc(at)
        limits = json.dumps(dict(thresholds), sort_keys=True, separators=(",", ":"))
        values = (
            tenant,
            policy,
            revision,
            suite,
            digest,
            {k: float(v) for k, v in metrics.items()},
            limits,
            passed,
            list(failures),
            refused,
            at,
            by,
            event_id,
        )
        # Microseconds since the epoch: the event's time orders writes, never the wall clock.
        self._run(self._ins_evaluation, (*values, int(at.timestamp() * 1_000_000)))
        return Evaluation(*values[:6], json.loads(limits), *values[7:])

    def evaluations(
        self, tenant: str, policy: str, revision: int | None = None
    ) -> list[Evaluation]:
        """The latest result per (revision, suite) of a policy, or of one revision; newest
        revision first, suites by name."""
        check_name("tenant", tenant)
        check_name("policy", policy)
        if revision is None:
            rows = self._run(self._list_evaluations, (tenant, policy))
        else:
            check_revision(revision)
            rows = self._run(self._revision_evaluations, (tenant, policy, revision))
        return [from_row(Evaluation, r) for r in rows]

    def evaluations_by_revision(self, tenant: str, policy: str) -> dict[int, list[Evaluation]]:
        """``evaluations`` of a policy grouped by revision (one read for a listing)."""
        out: dict[int, list[Evaluation]] = {}
        for e in self.evaluations(tenant, policy):
            out.setdefault(e.revision, []).append(e)
        return out
