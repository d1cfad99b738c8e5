"""Prometheus metrics of the lifecycle controller (``MINT_METRICS_PORT``, streams.health).

Counted once per input event: a redelivered event (recognised from the saved state) re-emits
its outputs and counts nothing again.

- ``mint_controller_gate_verdicts_total{verdict}``: evaluations of a configured policy judged
  against its gate, ``passed`` or ``failed``;
- ``mint_controller_alias_moves_total{cause}``: alias moves the controller carried out by
  compare-and-set, ``promote`` or ``rollback``;
- ``mint_controller_refusals_total{command}``: serving commands refused (stale
  compare-and-set, unknown revision), ``serving.promote`` or ``serving.rollback``;
- ``mint_controller_events_total{type}``: events the controller emitted, by type;
- ``mint_controller_evaluations_ignored_total{reason}``: results that decide nothing:
  ``other_suite`` (not the policy's configured suite, or no configuration) or ``refused`` (the
  evaluator did not run it);
- ``mint_controller_stale_moves_total``: alias moves older than the view (a replay): not applied;
- ``mint_controller_canaries_total{step}``: canaries ``started``, ``promoted``, ``rolled_back``.
"""

from __future__ import annotations

from prometheus_client import Counter

GATE_VERDICTS = Counter(
    "mint_controller_gate_verdicts",
    "evaluations judged against the policy's configured gate",
    ["verdict"],
)
ALIAS_MOVES = Counter(
    "mint_controller_alias_moves", "alias moves carried out by compare-and-set", ["cause"]
)
REFUSALS = Counter("mint_controller_refusals", "serving commands refused", ["command"])
EMITTED = Counter("mint_controller_events", "events the controller emitted", ["type"])

IGNORED = Counter(
    "mint_controller_evaluations_ignored",
    "evaluation results that decide nothing (another suite, refused)",
    ["reason"],
)
STALE_MOVES = Counter(
    "mint_controller_stale_moves",
    "alias moves older than the controller's view (replays), not applied",
)

CANARIES = Counter("mint_controller_canaries", "canaries started and ended, by step", ["step"])

PASSED, FAILED = GATE_VERDICTS.labels("passed"), GATE_VERDICTS.labels("failed")
