"""Log set-up: drivers' noise stays out of a normal command's output, their errors do not."""

from __future__ import annotations

import logging

import kafka.errors

from schemas.logs import hush_driver_noise


def test_a_metadata_refresh_cancelled_by_a_close_is_not_logged_but_real_failures_are(
    caplog,
) -> None:
    hush_driver_noise()  # what configure_logging does for them
    log = logging.getLogger("kafka.cluster")
    with caplog.at_level(logging.ERROR, logger="kafka.cluster"):
        log.error("Metadata refresh: failed %s", kafka.errors.Cancelled())
        log.error("Metadata refresh: failed %s", kafka.errors.KafkaConnectionError("refused"))
    messages = [r.getMessage() for r in caplog.records if r.name == "kafka.cluster"]
    assert messages == ["Metadata refresh: failed KafkaConnectionError: refused"]
