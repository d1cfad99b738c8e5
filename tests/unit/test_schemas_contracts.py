"""The checked-in JSON Schemas: fresh, backward compatible with released versions, and usable
on their own (a foreign producer validating with `jsonschema` gets the same answers)."""

from __future__ import annotations

import json

import jsonschema
import pytest
from pydantic import Field

from schemas import EVENT_TYPES, encode_event, make_event
from schemas.contracts import (
    CONTRACTS_DIR,
    RELEASED_DIR,
    all_schemas,
    check_released,
    event_schema,
    incompatibilities,
    stale,
    write,
)
from schemas.events import ExportCompleted, InferFailed
from schemas.examples import example_payload


def test_checked_in_schemas_are_not_stale() -> None:
    assert stale() == [], "run `python -m schemas.contracts` and commit schemas/json/"


def test_current_models_are_compatible_with_every_released_version() -> None:
    assert sorted(p.name for p in RELEASED_DIR.glob("*.json")) == sorted(all_schemas())
    assert check_released() == {}


def test_stale_detects_a_changed_file(tmp_path) -> None:
    write(tmp_path)
    assert stale(tmp_path) == []
    path = tmp_path / "export.completed.v1.json"
    path.write_text(path.read_text().replace("revision number", "revision no."))
    (tmp_path / "gone.v1.json").write_text("{}")
    assert stale(tmp_path) == ["export.completed.v1.json", "gone.v1.json"]


def _object(props: dict, required: list[str]) -> dict:
    return {"type": "object", "properties": props, "required": required}


INT, STR, NUM = {"type": "integer"}, {"type": "string"}, {"type": "number"}
OPT_INT = {"anyOf": [INT, {"type": "null"}]}


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        (_object({"a": INT}, ["a"]), _object({"a": INT}, ["a"]), []),
        (_object({"a": INT}, ["a"]), _object({"a": INT, "b": STR}, ["a"]), []),  # optional added
        (_object({"a": INT}, ["a"]), _object({"a": OPT_INT}, []), []),  # widened, now optional
        (_object({"a": INT}, ["a"]), _object({"a": NUM}, ["a"]), []),  # int → number widens
        (_object({"a": INT}, ["a"]), _object({}, []), ["$.a: field removed"]),
        (
            _object({"a": INT}, []),
            _object({"a": INT, "b": STR}, ["b"]),
            ["$.b: new required field"],
        ),
        (_object({"a": INT}, []), _object({"a": INT}, ["a"]), ["$.a: new required field"]),
        (
            _object({"a": INT}, []),
            _object({"a": STR}, []),
            ["$.a: type changed from ['integer'] to ['string']"],
        ),
        (
            _object({"a": OPT_INT}, []),
            _object({"a": INT}, []),
            ["$.a: type changed from ['integer', 'null'] to ['integer']"],
        ),
        (
            _object({"a": {"type": "array", "items": INT}}, []),
            _object({"a": {"type": "array", "items": STR}}, []),
            ["$.a[]: type changed from ['integer'] to ['string']"],
        ),
        (
            _object({"p": {"$ref": "#/$defs/P"}}, []) | {"$defs": {"P": _object({"x": INT}, [])}},
            _object({"p": {"$ref": "#/$defs/P"}}, []) | {"$defs": {"P": _object({}, [])}},
            ["$.p.x: field removed"],
        ),
    ],
)
def test_incompatibility_rules(old: dict, new: dict, expected: list[str]) -> None:
    assert incompatibilities(old, new) == expected


def test_a_real_model_change_is_caught_against_the_released_contract() -> None:
    released = json.loads((RELEASED_DIR / "export.completed.v1.json").read_text())

    class Changed(ExportCompleted):  # what an engineer might "just add" to v1
        training_run: str = Field(min_length=1)
        rank: str  # type: ignore[assignment]

    import schemas.registry as registry

    saved = registry.PAYLOADS[("export.completed", 1)]
    registry.PAYLOADS[("export.completed", 1)] = Changed
    try:
        found = incompatibilities(released, event_schema("export.completed", 1))
    finally:
        registry.PAYLOADS[("export.completed", 1)] = saved
    assert "$.payload.training_run: new required field" in found
    assert any(f.startswith("$.payload.rank: type changed") for f in found)


@pytest.mark.parametrize("event_type", sorted(EVENT_TYPES))
def test_wire_events_validate_against_their_checked_in_schema(event_type: str) -> None:
    schema = json.loads((CONTRACTS_DIR / f"{event_type}.v1.json").read_text())
    env = make_event(example_payload(event_type), tenant="acme", policy="math-rl", producer="t")
    validator = jsonschema.Draft202012Validator(
        schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER
    )
    validator.validate(json.loads(encode_event(env)))


def test_schema_alone_rejects_what_the_models_reject() -> None:
    schema = json.loads((CONTRACTS_DIR / "serving.promote.v1.json").read_text())
    env = make_event(example_payload("serving.promote"), tenant="acme", policy="p", producer="t")
    wire = json.loads(encode_event(env))
    for path, value in [
        (("tenant",), "ACME"),
        (("payload", "revison"), 2),
        (("type",), "x.y"),
        (("payload", "revision"), 0),
    ]:
        bad = json.loads(json.dumps(wire))
        target = bad
        for part in path[:-1]:
            target = target[part]
        target[path[-1]] = value
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)


def test_an_engine_refusal_is_an_infer_failed_with_stage_validate_and_its_code() -> None:
    # The gateway answers it with HTTP 400 and the code (OpenAI's error shape): the contract a
    # foreign consumer reads it by.
    schema = json.loads((CONTRACTS_DIR / "infer.failed.v1.json").read_text())
    refusal = InferFailed(
        request_id="r1",
        ref="acme/p@prod",
        stage="validate",
        code="context_length_exceeded",
        engine_id="e0",
        error="the prompt has 300 tokens; max_model_len is 256",
    )
    wire = json.loads(encode_event(make_event(refusal, tenant="acme", policy="p", producer="t")))
    jsonschema.validate(wire, schema)
    assert schema["properties"]["payload"]["$ref"]  # (the payload is a definition)
    payload = schema["$defs"]["InferFailed"]["properties"]
    assert (
        "validate" in payload["stage"]["enum"]
        and "code" not in schema["$defs"]["InferFailed"]["required"]
    )
    wire["payload"]["code"] = "x" * 65
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(wire, schema)
