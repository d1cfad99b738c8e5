"""Exporting a policy's adapter as its next revision: store, catalog, ``export.completed``.

One way for both callers: update requests (worker.py) and step-level ``save_for_sampler``
calls (steps.py). :class:`RevisionExporter` is the part of
:class:`~workers.trainer.worker.TrainerService` that does it.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

import structlog

from catalog.exceptions import PolicyNotFound, PolicyRetired
from catalog.repository import CatalogRepository
from catalog.store import AdapterStore, StoredAdapter
from schemas import Envelope
from schemas.envelope import make_reply
from schemas.events import ExportCompleted, TrainingFigures
from streams.exceptions import Refused
from workers.trainer.engine import MultiPolicyTrainer

log = structlog.get_logger()

_EVENT_NS = uuid.UUID("0d7f3a52-8b1e-4c55-a0d6-2f9e61b4c7a3")


def derived_id(request_id: uuid.UUID, what: str) -> uuid.UUID:
    """Event ids that follow from the request: a re-run publishes the very same events."""
    return uuid.uuid5(_EVENT_NS, f"{request_id}:{what}")


class RevisionExporter:
    """Provided by the service: the trainer, store, catalog and the name events carry."""

    trainer: MultiPolicyTrainer
    store: AdapterStore
    repo: CatalogRepository
    name: str

    def refuse_retired(self, env: Envelope[Any]) -> None:
        """Refuse (dead-letter, no retries) a request that would export a revision of a
        retired policy, before anything is trained: its revision could not be registered."""
        try:
            pol = self.repo.get_policy(env.tenant, env.policy)
        except PolicyNotFound:
            return  # its first export creates it
        if pol.retired_at is not None and not self.repo.is_applied(
            derived_id(env.event_id, "export")
        ):
            # (A request whose revision was registered before a crash re-runs to announce it.)
            raise Refused(
                f"{env.type} {env.event_id} not carried out: policy {env.policy_id} was retired "
                f"at {pol.retired_at.isoformat()} (restore it with `mint policies retire "
                f"{env.policy_id} --undo` and send the request again)"
            )

    def export_revision(
        self,
        env: Envelope[Any],
        training: dict[str, Any],
        figures: TrainingFigures | None = None,
    ) -> dict[str, Any]:
        """Store the policy's adapter as its next revision and register it in the catalog; the
        figures ``export_event`` announces. Idempotent per ``env`` (the catalog dedupes by
        digest and by the event id derived from it). Update requests and step-level
        ``save_for_sampler`` calls (steps.py) both export here. ``training``: the manifest's
        record; ``figures``: what the training measured, registered with the revision and
        announced on ``export.completed``."""
        pid = env.policy_id
        parent_revision = self.trainer.policy(pid).parent_revision
        base_model = self.trainer.config.base_model
        stored = self.trainer.export(pid, env.tenant, env.policy, training=training)
        # Registered exactly as the projection of the export.completed event registers it (same
        # event id, time, author and metadata), so a catalog rebuilt from the log equals this one.
        export_id, at = derived_id(env.event_id, "export"), datetime.now(UTC)
        try:
            self.repo.get_policy(env.tenant, env.policy)
        except PolicyNotFound:
            self.repo.create_policy(env.tenant, env.policy, base_model, by=self.name, at=at)
        try:
            rev = self.repo.register_revision(
                env.tenant,
                env.policy,
                digest=stored.digest,
                store_uri=stored.uri,
                base_model=base_model,
                parent_revision=parent_revision,
                metadata=_revision_metadata(stored),
                source_event_id=export_id,
                by=self.name,
                at=at,
                training=figures.figures() if figures is not None else None,
            )
        except PolicyRetired as e:
            # Retired while this request trained: the request's failure (a refusal, dead-lettered
            # at once; the caller restores the weights it started from), never a retry loop.
            raise Refused(f"{env.type} {env.event_id} not carried out: {e}") from e
        state = self.trainer.policy(pid)
        if rev.digest != stored.digest:
            # This request registered a revision before (crash before the request record):
            # that revision is the answer, and our copy must continue from it, not from ours.
            log.warning(
                "update_already_registered", request=str(env.event_id), revision=rev.revision
            )
            self.trainer.remove_policy(pid)
            stored = self.store.open(
                rev.store_uri,
                owner=(env.tenant, env.policy),
                base_model_fingerprint=self.trainer.fingerprint,
            )
            state = self.trainer.add_policy(pid, parent=stored, parent_revision=rev.revision)
        state.parent, state.parent_revision = stored, rev.revision
        return {
            "exported_at": rev.created_at.replace(tzinfo=UTC).isoformat(),
            "revision": rev.revision,
            "parent_revision": parent_revision,
            "digest": stored.digest,
            "store_uri": stored.uri,
            "base_model": base_model,
            # The catalog's figures (a revision registered before keeps the ones it has).
            "training": dict(rev.training),
            **_revision_metadata(stored),
        }

    def export_event(self, env: Envelope[Any], r: dict[str, Any]) -> Envelope[ExportCompleted]:
        """The ``export.completed`` of ``export_revision``'s result ``r`` (same id every time)."""
        export = ExportCompleted(
            revision=r["revision"],
            adapter_digest=r["digest"],
            store_uri=r["store_uri"],
            size_bytes=r["size_bytes"],
            rank=r["rank"],
            lora_alpha=r["lora_alpha"],
            target_modules=r["target_modules"],
            target_parameters=r["target_parameters"],
            base_model=r["base_model"],
            base_model_fingerprint=r["base_model_fingerprint"],
            parent_revision=r["parent_revision"],
            training=TrainingFigures(**r["training"]) if r.get("training") else None,
        )
        at = r.get("exported_at")
        return make_reply(
            export,
            env,
            producer=self.name,
            event_id=derived_id(env.event_id, "export"),
            occurred_at=datetime.fromisoformat(at) if at else None,
        )


def _revision_metadata(stored: StoredAdapter) -> dict[str, Any]:
    """A stored revision's figures, as the catalog registers them and export.completed says."""
    m = stored.manifest
    return {
        "size_bytes": stored.size_bytes,
        "rank": m.rank,
        "lora_alpha": m.lora_alpha,
        "target_modules": list(m.target_modules),
        "target_parameters": list(m.target_parameters),
        "base_model_fingerprint": m.base_model_fingerprint,
    }
