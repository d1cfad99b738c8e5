"""A faust worker for tests: counts promote commands per policy in a table and reports each
count on ``<prefix>.test.counts``. Run: ``python faust_counter.py worker -l warn``."""

from __future__ import annotations

import json

from schemas.settings import MintSettings
from streams.faust_app import decoded, event_topic, make_app

settings = MintSettings()
app = make_app(settings, "counter")
commands = event_topic(app, settings, "serving.commands")
counts_out = app.topic(settings.topic("test.counts"), value_serializer="raw", key_serializer="raw")
counts = app.Table("counts", default=int)


@app.agent(commands)
async def count(stream):
    async for envelope in decoded(app, settings, stream, "counter"):
        counts[envelope.policy_id] += 1
        report = {
            "policy": envelope.policy_id,
            "count": counts[envelope.policy_id],
            "revision": envelope.payload.revision,
        }
        await counts_out.send(key=envelope.key, value=json.dumps(report).encode())


if __name__ == "__main__":
    app.main()
