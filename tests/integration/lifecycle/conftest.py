"""Fixtures of the lifecycle integration tests."""

from __future__ import annotations

import pytest

from tests.integration.lifecycle._helpers import Proc


@pytest.fixture
def procs(tmp_path):
    started: list[Proc] = []

    def start(settings, name: str, *args: str, **env: str) -> Proc:
        p = Proc(settings, tmp_path / f"{name}.log", *args, **env)
        started.append(p)
        return p

    yield start
    for p in started:
        p.stop()
