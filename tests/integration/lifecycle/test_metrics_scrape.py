"""The projector and the controller as real worker processes with ``MINT_METRICS_PORT``: after an
export, an evaluation that passes the gate (a promotion), one that fails it and a poison record,
their ``/metrics`` show it; and their log lines carry the export's correlation id."""

from __future__ import annotations

import contextlib
import json
import socket

from catalog.repository import CatalogRepository
from mint.sdk import MintClient
from streams.producer import EventProducer
from tests._metrics import scrape, total
from tests.integration.lifecycle._helpers import wait_until
from tests.integration.lifecycle.test_controller import answer, export


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def log_lines(proc) -> list[dict]:
    out = []
    for line in proc.log.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            with contextlib.suppress(json.JSONDecodeError):
                out.append(json.loads(line))
    return out


def test_projector_and_controller_metrics_move_and_logs_carry_correlation_ids(
    settings, live, procs
) -> None:
    repo = CatalogRepository(live, settings.keyspace)
    tenant, policy = "acme", "metered"
    ports = {"projector": free_port(), "controller": free_port()}
    projector = procs(
        settings,
        "projector",
        "projector",
        MINT_METRICS_PORT=str(ports["projector"]),
        MINT_LOG_LEVEL="DEBUG",
    )
    controller = procs(
        settings, "controller", "controller", MINT_METRICS_PORT=str(ports["controller"])
    )
    client = MintClient(settings, tenant, producer="test", timeout_s=120)
    producer = EventProducer(settings)
    try:
        # Both serve /healthz while they run.
        for name, proc in (("projector", projector), ("controller", controller)):
            wait_until(lambda n=name: scrape(ports[n]), 60, f"{name} /metrics", proc)
        configured = client.create_policy(
            policy, base_model="tiny", suite="toy", thresholds={"reward": {"min": 0.6}}
        )
        exports = {}
        for n, reward in ((1, 0.7), (2, 0.4)):  # 1 passes the gate and is promoted, 2 fails
            exports[n] = exp = export(repo, tenant, policy, n)
            producer.publish(exp)
            req = client.wait_for(
                lambda e, n=n: (
                    e.type == "eval.requested" and e.policy == policy and e.payload.revision == n
                ),
                what=f"eval.requested of {n}",
            )
            producer.publish(answer(req, reward))
            if n == 1:
                cmd = client.wait_for(
                    lambda e: e.type == "serving.promote" and e.policy == policy,
                    what="serving.promote",
                )
                client.wait_caused_by(cmd, "alias.moved")
        export_topic = settings.topic("export.events")
        producer.send_raw(export_topic, b"not an event", b"acme/metered")  # poison: both read it

        def lag_sampled(m: dict) -> bool:  # refreshed after polls, at most once a second
            return any(n == "mint_consumer_lag_records" for n, _ in m)

        def controller_done(m: dict) -> dict | None:
            ok = (
                total(m, "mint_controller_gate_verdicts_total", verdict="failed") == 1
                and total(m, "mint_consumer_dead_letters_total", topic=export_topic) == 1
                and lag_sampled(m)
            )
            return m if ok else None

        def projector_done(m: dict) -> dict | None:
            ok = (
                total(m, "mint_projector_alias_moves_total") == 1
                and total(m, "mint_consumer_dead_letters_total", topic=export_topic) == 1
                and lag_sampled(m)
            )
            return m if ok else None

        c = wait_until(
            lambda: controller_done(scrape(ports["controller"])),
            60,
            "the controller's metrics",
            controller,
        )
        p = wait_until(
            lambda: projector_done(scrape(ports["projector"])),
            60,
            "the projector's metrics",
            projector,
        )
    finally:
        client.close()
        producer.close()

    # Controller: verdicts, the move it carried out, what it emitted, records per topic.
    group = f"{settings.topic_prefix}-controller"
    assert total(c, "mint_controller_gate_verdicts_total", verdict="passed") == 1
    assert total(c, "mint_controller_alias_moves_total", cause="promote") == 1
    assert total(c, "mint_controller_events_total", type="eval.requested") == 2
    assert total(c, "mint_controller_events_total", type="serving.promote") == 1
    assert (
        total(c, "mint_consumer_records_total", group=group, topic=export_topic, outcome="handled")
        == 2
    )
    assert (
        total(
            c,
            "mint_consumer_records_total",
            group=group,
            topic=settings.topic("eval.results"),
            outcome="handled",
        )
        == 2
    )
    assert (
        total(
            c,
            "mint_consumer_dead_letters_total",
            group=group,
            topic=export_topic,
            reason="undecodable",
        )
        == 1
    )
    lag = {lb: v for (n, lb), v in c.items() if n == "mint_consumer_lag_records"}
    assert lag and all(("group", group) in lb for lb in lag), lag
    assert total(c, "mint_consumer_waiting_out_outage", group=group) == 0

    # Projector: the exports and the move applied to the catalog, the poison dead-lettered.
    pgroup = f"{settings.topic_prefix}-catalog-projector"
    # (the trainer registered the exports before announcing them: the projector finds them there)
    assert (
        total(p, "mint_projector_events_total", type="export.completed", outcome="duplicate") == 2
    )
    assert total(p, "mint_projector_events_total", type="alias.moved", outcome="applied") == 1
    assert total(p, "mint_projector_alias_moves_total", cause="promote") == 1
    assert (
        total(
            p,
            "mint_consumer_dead_letters_total",
            group=pgroup,
            topic=export_topic,
            reason="undecodable",
        )
        == 1
    )
    assert (
        total(p, "mint_consumer_records_total", group=pgroup, topic=export_topic, outcome="handled")
        == 2
    )

    # The promotion followed by its correlation id through both workers' log lines: the
    # controller deciding it and carrying it out, the projector applying the move. (The chain
    # starts at the export, or at the policy's configuration when the controller read that
    # after the export: topics are not ordered among each other.)
    cid = str(cmd.correlation_id)
    assert cid in (str(exports[1].correlation_id), str(configured.correlation_id))
    controller_lines = [e for e in log_lines(controller) if e.get("correlation_id") == cid]
    transitions = {e["type"] for e in controller_lines if e["event"] == "transition"}
    assert transitions >= {"eval.requested", "serving.promote", "alias.moved"}, controller_lines

    def projected(correlation_id) -> set[tuple[str, str]]:
        return {
            (e["type"], e["outcome"])
            for e in log_lines(projector)
            if e["event"] == "projected" and e.get("correlation_id") == str(correlation_id)
        }

    assert ("alias.moved", "applied") in projected(cid)
    assert ("export.completed", "duplicate") in projected(exports[1].correlation_id)
