"""Envelope, payloads, names and the codec: strict where the issue says so, with clear errors."""

from __future__ import annotations

import json
import uuid
from datetime import datetime

import pytest
from pydantic import ValidationError

from schemas import (
    EVENT_TYPES,
    EventDecodeError,
    EventValidationError,
    SchemaError,
    UnknownEventType,
    UnsupportedSchemaVersion,
    decode_event,
    encode_event,
    make_event,
    split_policy_id,
)
from schemas.events import DeadLetter, EvalCompleted, ExportCompleted, PromoteCommand
from schemas.examples import example_fields, example_payload


def _event(event_type: str = "export.completed", tenant: str = "acme", policy: str = "math-rl"):
    return make_event(
        example_payload(event_type, tenant, policy), tenant=tenant, policy=policy, producer="test"
    )


def _wire(event_type: str = "export.completed") -> dict:
    return json.loads(encode_event(_event(event_type)))


@pytest.mark.parametrize("event_type", sorted(EVENT_TYPES))
def test_every_event_type_round_trips_through_bytes(event_type: str) -> None:
    env = _event(event_type)
    back = decode_event(encode_event(env))
    assert back == env
    assert type(back.payload) is EVENT_TYPES[event_type]
    assert back.key == b"acme/math-rl"


def test_make_event_links_correlation_and_causation() -> None:
    first = _event("eval.completed")
    second = make_event(
        PromoteCommand(revision=1),
        tenant="acme",
        policy="math-rl",
        producer="ctl",
        caused_by=first,
    )
    assert first.correlation_id == first.event_id and first.causation_id is None
    assert second.correlation_id == first.event_id
    assert second.causation_id == first.event_id


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("tenant", "Acme", "tenant"),
        ("tenant", "-acme", "tenant"),
        ("tenant", "a" * 64, "tenant"),
        ("tenant", "ac/me", "tenant"),
        ("policy", "../etc", "policy"),
        ("policy", "Math", "policy"),
        ("policy", "a/b", "policy"),
        ("producer", "", "producer"),
        ("event_id", "not-a-uuid", "event_id"),
        ("occurred_at", "2026-01-01T00:00:00", "occurred_at"),  # no timezone
        ("correlation_id", None, "correlation_id"),
    ],
)
def test_envelope_fields_are_validated(field: str, value: object, match: str) -> None:
    wire = _wire()
    wire[field] = value
    with pytest.raises(EventValidationError, match=match):
        decode_event(json.dumps(wire).encode())


@pytest.mark.parametrize(
    ("uri", "match"),
    [
        ("s3://mint-store/acme/math-rl/../other/revisions/1", "traversal"),
        ("s3://mint-store/acme/math-rl/./x", "traversal"),
        ("file:///srv/acme/math-rl/%2e%2e/x", "'%'"),
        ("file://relative/acme/math-rl/x", "absolute"),
        ("s3:///acme/math-rl/x", "bucket"),
        ("http://host/acme/math-rl/x", "file:///"),
        ("s3://mint-store/evil/math-rl/revisions/1", "outside the namespace of acme/math-rl"),
        ("s3://mint-store/acme/other-policy/revisions/1", "outside the namespace"),
        ("s3://mint-store/acme/math-rl-evil/revisions/1", "outside the namespace"),
        ("s3://mint-store/acme//math-rl/x", "empty path segment"),
        ("s3://mint-store/acme/math-rl/x y", "spaces"),
    ],
)
def test_store_uris_reject_traversal_and_other_namespaces(uri: str, match: str) -> None:
    wire = _wire()
    wire["payload"]["store_uri"] = uri
    with pytest.raises(EventValidationError, match=match):
        decode_event(json.dumps(wire).encode())


def test_store_uri_inside_the_namespace_is_accepted() -> None:
    wire = _wire()
    wire["payload"]["store_uri"] = "file:///var/mint/store/acme/math-rl/revisions/7"
    assert decode_event(json.dumps(wire)).payload.store_uri.endswith("/revisions/7")


@pytest.mark.parametrize(
    "digest",
    ["sha256:" + "A" * 64, "sha256:" + "a" * 63, "md5:" + "a" * 32, "a" * 64, "sha256:"],
)
def test_digests_must_be_lowercase_sha256(digest: str) -> None:
    fields = example_fields("export.completed") | {"adapter_digest": digest}
    with pytest.raises(ValidationError, match="adapter_digest"):
        ExportCompleted(**fields)


@pytest.mark.parametrize(
    "event_type",
    [
        "serving.promote",
        "serving.rollback",
        "update.requested",
        "rollout.requested",
        "load.requested",
        "infer.requested",
        "eval.requested",
    ],
)
def test_commands_reject_unknown_fields(event_type: str) -> None:
    wire = _wire(event_type)
    wire["payload"]["revison"] = 3  # a typo must not be silently ignored
    with pytest.raises(EventValidationError, match=r"payload\.revison: Extra inputs"):
        decode_event(json.dumps(wire))


def test_events_tolerate_unknown_payload_fields_from_newer_producers() -> None:
    wire = _wire("alias.moved")
    wire["payload"]["added_later"] = "x"
    assert decode_event(json.dumps(wire)).payload.to_revision == 1


def test_envelope_rejects_unknown_fields() -> None:
    wire = _wire()
    wire["causation"] = str(uuid.uuid4())
    with pytest.raises(EventValidationError, match="causation: Extra inputs"):
        decode_event(json.dumps(wire))


@pytest.mark.parametrize(
    ("data", "error", "reason"),
    [
        (b"\xff\xfe", EventDecodeError, "undecodable"),
        (b"not json", EventDecodeError, "undecodable"),
        (b"[1, 2]", EventDecodeError, "undecodable"),
        (None, EventDecodeError, "undecodable"),
        (b'{"schema_version": 1}', EventValidationError, "invalid"),
        (b'{"type": "export.completed", "schema_version": "1"}', EventValidationError, "invalid"),
        (b'{"type": "nope.nope", "schema_version": 1}', UnknownEventType, "unknown_type"),
        (
            b'{"type": "export.completed", "schema_version": 9}',
            UnsupportedSchemaVersion,
            "unknown_version",
        ),
    ],
)
def test_decode_errors_name_a_dead_letter_reason(data, error, reason) -> None:
    with pytest.raises(error) as info:
        decode_event(data)
    assert isinstance(info.value, SchemaError) and isinstance(info.value, ValueError)
    assert info.value.reason == reason


def test_type_and_version_must_match_the_payload() -> None:
    wire = _wire("load.evicted")
    wire["type"] = "load.loaded"  # payload lacks load_ms
    with pytest.raises(EventValidationError, match="load_ms"):
        decode_event(json.dumps(wire))


def test_wrong_field_error_names_field_value_and_contract() -> None:
    wire = _wire()
    wire["payload"]["rank"] = 0
    with pytest.raises(EventValidationError) as info:
        decode_event(json.dumps(wire))
    text = str(info.value)
    assert "payload.rank" in text and "(got 0)" in text
    assert "schemas/json/export.completed.v1.json" in text


def test_make_event_wraps_envelope_errors() -> None:
    with pytest.raises(EventValidationError, match="cannot build a export.completed event.*tenant"):
        make_event(
            example_payload("export.completed"), tenant="Bad", policy="math-rl", producer="t"
        )


def test_eval_verdict_must_agree_with_thresholds() -> None:
    fields = example_fields("eval.completed") | {"metrics": {"accuracy": 0.1}}
    with pytest.raises(ValidationError, match="disagree"):
        EvalCompleted(**fields)
    ok = EvalCompleted(**fields | {"passed": False, "failures": ["accuracy"]})
    assert not ok.passed


def test_payloads_are_frozen() -> None:
    with pytest.raises(ValidationError):
        example_payload("export.completed").revision = 2  # type: ignore[misc]


def test_dead_letter_headers_round_trip() -> None:
    letter = DeadLetter(reason="invalid", error="x", topic="t", partition=1, offset=5, group="g")
    headers = letter.to_headers()
    assert ("mint.dlq.reason", b"invalid") in headers
    assert DeadLetter.from_headers(headers + [("other", b"1")]) == letter


@pytest.mark.parametrize("value", ["acme", "acme/", "/p", "Acme/p", "acme/p/q"])
def test_split_policy_id_rejects_bad_ids(value: str) -> None:
    with pytest.raises(ValueError, match="tenant/policy"):
        split_policy_id(value)


def test_split_policy_id() -> None:
    assert split_policy_id("acme/math-rl.v2") == ("acme", "math-rl.v2")


def test_occurred_at_is_timezone_aware() -> None:
    assert _event().occurred_at.tzinfo is not None
    assert isinstance(_event().occurred_at, datetime)
