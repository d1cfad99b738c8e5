"""Each streams test drops the topics of its own prefix afterwards, so repeated runs do not pile
partitions onto the single local broker."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _drop_own_topics(request: pytest.FixtureRequest):
    yield
    settings = request.node.funcargs.get("settings")
    if settings is None:
        return
    from streams import make_admin

    admin = make_admin(settings)
    try:
        own = [t for t in admin.list_topics() if t.startswith(f"{settings.topic_prefix}.")]
        if own:
            admin.delete_topics(own)
    finally:
        admin.close()
