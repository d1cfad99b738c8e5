"""`mint timeline` names canary, tag and retirement events as steps people recognise."""

from __future__ import annotations

import uuid

from schemas import make_event
from schemas.events import (
    CanaryCommand,
    CanaryEnded,
    CanaryStarted,
    PolicyRetirement,
    RevisionTagged,
)
from streams.timeline import step_of

D = "sha256:" + "ab" * 32
CID = uuid.uuid4()


def _step(payload):
    return step_of(make_event(payload, tenant="acme", policy="math", producer="test"))


def test_canary_steps_say_who_got_which_revision_and_how_it_ended():
    asked = _step(CanaryCommand(revision=3, share=0.1, reason="try it"))
    assert (asked.kind, asked.revision, asked.detail) == ("canary asked", 3, "@prod 10% try it")
    started = _step(
        CanaryStarted(
            alias="prod",
            canary_id=CID,
            incumbent_revision=2,
            revision=3,
            adapter_digest=D,
            store_uri="file:///s/acme/math/3",
            share=0.1,
        )
    )
    assert started.kind == "canaried" and "the rest on r2" in started.detail
    for outcome, kind in (("promoted", "canary won"), ("rolled_back", "canary ended")):
        ended = CanaryEnded(
            alias="prod",
            canary_id=CID,
            revision=3,
            incumbent_revision=2,
            outcome=outcome,
            reason="figures",
        )
        assert _step(ended).kind == kind


def test_tags_and_retirement_are_steps():
    assert _step(RevisionTagged(revision=2, tags=["a", "b"])).detail == "a, b"
    assert _step(RevisionTagged(revision=2)).detail == "no tags"
    assert _step(PolicyRetirement(retired=True, reason="old")).kind == "retired"
    assert _step(PolicyRetirement(retired=False)).kind == "restored"
