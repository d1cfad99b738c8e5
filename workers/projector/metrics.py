"""Prometheus metrics of the catalog projector (``MINT_METRICS_PORT``, streams.health).

- ``mint_projector_events_total{type,outcome}``: events projected, ``applied``, ``duplicate``
  (seen before: nothing written) or ``ignored`` (not a catalog event);
- ``mint_projector_alias_moves_total{cause}``: alias moves applied to the catalog and published
  to ``policy.state``, ``promote`` or ``rollback``.
"""

from __future__ import annotations

from prometheus_client import Counter

EVENTS = Counter("mint_projector_events", "events projected into the catalog", ["type", "outcome"])
ALIAS_MOVES = Counter(
    "mint_projector_alias_moves",
    "alias moves applied to the catalog and published to policy.state",
    ["cause"],
)
