"""The Tinker API's shared rows on real Cassandra (migration 8, catalog.tinker_calls): what one
gateway instance writes, another reads, tenant by tenant; a future's outcome round-trips the
gateway's encoding (gateway.tinker.shared)."""

from __future__ import annotations

import uuid

import pytest

from catalog.tinker_calls import ModelRecord, TinkerCalls
from gateway.tinker.futures import Done, Entry, Failed
from gateway.tinker.shared import entry_of, outcome_of, record_of


@pytest.fixture(scope="module")
def calls(catalog_keyspace) -> TinkerCalls:
    return TinkerCalls(*catalog_keyspace)


def test_models_calls_and_states_are_per_tenant(calls, tenant) -> None:
    model = ModelRecord("tkab12cd34:train:0", "tkab12cd34-0", "tiny/llama", 8, True, False)
    calls.add_model(tenant, model)
    assert calls.model(tenant, model.policy) == model
    assert calls.model(tenant + "x", model.policy) is None
    event = uuid.uuid4()
    calls.add_call(tenant, event, "gw-a.tk1")
    assert calls.call(tenant, event) == "gw-a.tk1" and calls.call(tenant + "x", event) is None
    calls.add_state(tenant, "tinker://p/weights/a", "file:///store/t/p/states/a")
    assert calls.state(tenant, "tinker://p/weights/a") == "file:///store/t/p/states/a"
    assert calls.state(tenant + "x", "tinker://p/weights/a") is None


@pytest.mark.parametrize(
    "outcome",
    [
        Done(json={"metrics": {"grad_norm:mean": 1.5}}),
        Done(proto=b"\x0a\x03abc"),
        Failed("optim_step: gradients are not finite", "user"),
        Failed("the call could not be queued", "server", queued=False),
    ],
)
def test_a_future_is_pending_until_settled_and_reads_back_as_it_was(calls, tenant, outcome) -> None:
    entry = Entry("gw-a.tk2", tenant, "optim_step", 0.0, {"model_id": "tkab12cd34:train:0"})
    calls.add_future(tenant, record_of(entry))
    row = calls.future(tenant, entry.request_id)
    assert row is not None and outcome_of(row) is None  # pending
    assert calls.future(tenant + "x", entry.request_id) is None
    calls.settle(tenant, record_of(entry_of(tenant, row), outcome))
    again = calls.future(tenant, entry.request_id)
    assert again is not None and outcome_of(again) == outcome
    assert entry_of(tenant, again).context == {"model_id": "tkab12cd34:train:0"}


def test_a_run_out_lease_is_taken_over_by_one_instance_only(calls, tenant) -> None:
    from datetime import UTC, datetime, timedelta

    from gateway.tinker.answers import lease_end

    entry = Entry("gw-a.tk3", tenant, "sample", 0.0, {"sample": {"policy": "p"}})
    past = (datetime.now(UTC) - timedelta(seconds=5)).replace(microsecond=0)
    calls.add_future(tenant, record_of(entry, lease_until=past))
    row = calls.future(tenant, entry.request_id)
    assert row is not None and row.lease_until == past
    until = lease_end()
    assert calls.claim(tenant, entry.request_id, row.lease_until, until)  # b takes it
    assert not calls.claim(tenant, entry.request_id, row.lease_until, until)  # c is too late
    later = until + timedelta(seconds=3)
    calls.renew(tenant, entry.request_id, later)  # b runs it
    assert calls.future(tenant, entry.request_id).lease_until == later
    # settling keeps the lease and records the outcome
    calls.settle(tenant, record_of(entry, Done(proto=b"x")))
    done = calls.future(tenant, entry.request_id)
    assert outcome_of(done) == Done(proto=b"x") and done.lease_until == later
