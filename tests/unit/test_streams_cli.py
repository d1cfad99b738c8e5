"""`mint tail`'s record formatting and the replay CLI's argument checks (no broker)."""

from __future__ import annotations

from click.testing import CliRunner
from kafka.consumer.fetcher import ConsumerRecord

from mint.commands.streams import _parse_time, format_record, replay
from schemas import encode_event, make_event
from schemas.events import DeadLetter
from schemas.examples import example_payload


def _record(value, headers=()) -> ConsumerRecord:
    return ConsumerRecord(
        "mint.export.events",
        1,
        -1,
        42,
        1_764_680_400_000,
        0,
        b"acme/math-rl",
        value,
        list(headers),
        None,
        12,
        0,
        0,
    )


def test_format_record_shows_where_type_and_payload() -> None:
    env = make_event(
        example_payload("export.completed"), tenant="acme", policy="math-rl", producer="t"
    )
    line = format_record(_record(encode_event(env)))
    assert "mint.export.events[1]@42 acme/math-rl" in line
    assert "export.completed" in line and "revision=1" in line and str(env.event_id)[:8] in line


def test_format_record_shows_dead_letter_reason_and_origin() -> None:
    letter = DeadLetter(
        reason="undecodable",
        error="e",
        topic="mint.serving.commands",
        partition=0,
        offset=9,
        group="g",
    )
    line = format_record(_record(b"[not json", letter.to_headers()))
    assert "DLQ undecodable" in line and "mint.serving.commands/0/9" in line
    assert "\\[not json" in line or "[not json" in line


def test_naive_times_are_utc() -> None:
    assert _parse_time("2026-12-02T13:00:00").utcoffset().total_seconds() == 0


def test_replay_needs_exactly_one_target() -> None:
    result = CliRunner().invoke(replay, ["export.events"])
    assert result.exit_code == 2 and "exactly one of --to-topic or --processor" in result.output
    result = CliRunner().invoke(
        replay, ["export.events", "--from-time", "yesterday", "--to-topic", "x"]
    )
    assert result.exit_code != 0
