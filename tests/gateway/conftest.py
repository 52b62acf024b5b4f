from __future__ import annotations

import pytest

from tests.gateway.fake_engine import Behaviour, EngineThread


@pytest.fixture
def engines():
    """Start fake engines on their own threads: ``engines(tokens=4, usage="llamacpp")``."""
    started: list[EngineThread] = []

    def start(**behaviour) -> EngineThread:
        engine = EngineThread(Behaviour(**behaviour))
        started.append(engine)
        return engine

    yield start
    for engine in started:
        engine.stop()
