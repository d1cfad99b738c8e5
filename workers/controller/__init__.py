"""The lifecycle controller: a consumer-group worker with per-policy state that drives export →
evaluation → promotion through events, gate promotions on metric thresholds, execute promote and
rollback commands, and roll back automatically when the serving revision regresses.

Run it with ``mint worker controller``; the decisions are in :class:`Controller` (no I/O). It
raises no errors of its own: a command it cannot carry out is answered with a ``serving.refused``
event the caller reads (the SDK raises ``mint.sdk.CommandRefused``).
"""

from workers.controller.logic import Controller, derived_id, empty_state

__all__ = ["Controller", "derived_id", "empty_state"]
