"""Prometheus metrics of the trainer (served on ``MINT_METRICS_PORT``, streams.health).

- ``mint_trainer_step_seconds{objective}``: one optimizer step (forward, backward, update) over
  one batch, sft or rl;
- ``mint_trainer_tokens_total{objective}``: tokens trained on (``rate()`` of it is the
  sustained tokens/s);
- ``mint_trainer_tokens_per_second``: tokens/s of the latest step;
- ``mint_trainer_updates_total{outcome}``: update requests finished, ``trained`` or
  ``redelivered`` (done before: the same events re-published, nothing trained);
- ``mint_trainer_update_seconds``: one update request end to end (data, steps, export).
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

OBJECTIVES = ("sft", "rl")
STEP_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
UPDATE_BUCKETS = (0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0)

STEP_SECONDS = Histogram(
    "mint_trainer_step_seconds",
    "one optimizer step over one batch",
    ["objective"],
    buckets=STEP_BUCKETS,
)
TOKENS = Counter("mint_trainer_tokens", "tokens trained on", ["objective"])
TOKENS_PER_SECOND = Gauge("mint_trainer_tokens_per_second", "tokens per second of the latest step")
UPDATES = Counter("mint_trainer_updates", "update requests finished", ["outcome"])
UPDATE_SECONDS = Histogram(
    "mint_trainer_update_seconds", "one update request end to end", buckets=UPDATE_BUCKETS
)

_STEP = {o: STEP_SECONDS.labels(o) for o in OBJECTIVES}
_TOKENS = {o: TOKENS.labels(o) for o in OBJECTIVES}


def observe_step(objective: str, seconds: float, tokens: int) -> None:
    """One optimizer step of ``objective`` took ``seconds`` over ``tokens`` tokens."""
    _STEP[objective].observe(seconds)
    _TOKENS[objective].inc(tokens)
    if seconds > 0:
        TOKENS_PER_SECOND.set(tokens / seconds)
