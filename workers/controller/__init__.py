"""The lifecycle controller: a consumer-group worker with per-policy state that drives export →
evaluation → promotion through events, gate promotions on metric thresholds, execute promote and
rollback commands, and roll back automatically when the serving revision regresses.

Run it with ``mint worker controller``; the decisions are in :class:`Controller` (no I/O).
"""

from workers.controller.exceptions import CommandRefused, ControllerError
from workers.controller.logic import Controller, derived_id, empty_state

__all__ = ["CommandRefused", "Controller", "ControllerError", "derived_id", "empty_state"]
