"""Test worker: ``run_consumer`` over serving.commands with an idempotent file sink.

Each handling appends the event_id to ``<dir>/handled.log``; the sink is ``<dir>/sink/<event_id>``
(written once: a redelivered event is recognised and not applied twice). With
``KILL_AT_REVISION=N`` the handler, after handling revision N (sink written, offset not yet
committed), creates ``<dir>/ready`` and hangs until the test SIGKILLs the process.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from schemas.settings import MintSettings
from streams.group import run_consumer
from streams.records import stop_on_signals

out = Path(sys.argv[1])
kill_at = int(os.environ.get("KILL_AT_REVISION", "0"))
(out / "sink").mkdir(parents=True, exist_ok=True)


def handle(envelope, record) -> None:
    with open(out / "handled.log", "a") as log:
        log.write(f"{envelope.event_id}\n")
    target = out / "sink" / str(envelope.event_id)
    if not target.exists():  # idempotent on event_id
        tmp = target.with_suffix(".tmp")
        tmp.write_text(str(envelope.payload.revision))
        tmp.rename(target)
    if envelope.payload.revision == kill_at:
        (out / "ready").touch()
        time.sleep(3600)


stats = run_consumer(
    MintSettings(),
    ["serving.commands"],
    "redelivery",
    handle,
    idle_timeout_s=float(os.environ.get("IDLE_S", "3")),
    group_instance_id="redelivery-0",
    stop=stop_on_signals(),
)
print(f"handled={stats.handled}", flush=True)
