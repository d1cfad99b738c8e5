"""Test worker: ``run_transactional`` turning each promote command into one alias.moved event.

With ``KILL_AT_REVISION=N``, when ``process`` reaches revision N (the outputs of earlier inputs
of the same transaction already sent to the broker), it creates ``<dir>/ready`` and hangs until
the test SIGKILLs the process: the transaction is left open, never committed.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from schemas.envelope import make_event
from schemas.events import AliasMoved
from schemas.settings import MintSettings
from streams.transactional import run_transactional

out = Path(sys.argv[1])
kill_at = int(os.environ.get("KILL_AT_REVISION", "0"))
DIGEST = "sha256:" + "ab" * 32


def process(envelope, record):
    if envelope.payload.revision == kill_at:
        time.sleep(1.0)  # let the producer's sender thread ship the earlier outputs
        (out / "ready").touch()
        time.sleep(3600)
    moved = AliasMoved(
        alias=envelope.payload.alias,
        to_revision=envelope.payload.revision,
        adapter_digest=DIGEST,
        store_uri=f"s3://store/{envelope.tenant}/{envelope.policy}/revisions/1",
        cause="promote",
    )
    yield make_event(
        moved,
        tenant=envelope.tenant,
        policy=envelope.policy,
        producer="test/promoter",
        caused_by=envelope,
    )


stats = run_transactional(
    MintSettings(),
    ["serving.commands"],
    "promoter",
    "promoter-0",
    process,
    idle_timeout_s=float(os.environ.get("IDLE_S", "3")),
)
print(f"handled={stats.handled}", flush=True)
