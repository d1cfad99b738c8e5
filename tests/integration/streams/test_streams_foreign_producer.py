"""An event produced by a client we did not write: kcat (Debian's package), fed JSON that was
written by hand from the checked-in JSON Schema alone, is accepted by our consumer loop."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import jsonschema
import pytest

from schemas.contracts import CONTRACTS_DIR
from schemas.events import ExportCompleted, PromoteCommand
from schemas.settings import MintSettings
from streams import ensure_topics, run_consumer
from tests.integration.streams._streams_helpers import HERE

KCAT = shutil.which("kcat")
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


@pytest.fixture
def kcat() -> str:
    if KCAT is None:
        message = "kcat is not installed: `sudo apt-get install -y kcat` (Debian/Ubuntu)"
        if IN_CI:
            pytest.fail(f"CI=true and {message}", pytrace=False)
        pytest.skip(message)
    return KCAT


@pytest.mark.parametrize(
    ("sample", "registry_topic", "payload_type"),
    [
        ("kcat_export_completed.json", "export.events", ExportCompleted),
        ("kcat_serving_promote.json", "serving.commands", PromoteCommand),
    ],
)
def test_kcat_event_written_from_the_json_schema_is_accepted(
    settings: MintSettings, kcat: str, sample: str, registry_topic: str, payload_type: type
) -> None:
    text = (HERE / sample).read_text().strip()
    event = json.loads(text)
    schema = json.loads((CONTRACTS_DIR / f"{event['type']}.v1.json").read_text())
    jsonschema.Draft202012Validator(
        schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER
    ).validate(event)  # the sample follows the published contract

    ensure_topics(settings, [registry_topic, "dlq"])
    topic = settings.topic(registry_topic)
    subprocess.run(
        [kcat, "-P", "-b", settings.kafka_bootstrap, "-t", topic, "-K", "\t"],
        input=f"acme/math-rl\t{text}\n".encode(),
        check=True,
        timeout=20,
    )
    got = []
    stats = run_consumer(
        settings, [registry_topic], "foreign", lambda env, r: got.append((env, r)), max_records=1
    )
    assert stats.handled == 1 and stats.dead_lettered == 0
    envelope, record = got[0]
    assert record.key == b"acme/math-rl"
    assert type(envelope.payload) is payload_type
    assert str(envelope.event_id) == event["event_id"]
    assert envelope.payload.model_dump(mode="json", exclude_unset=True) == event["payload"]
