"""The gateway sends each engine its replica's key; an engine that wants one serves nobody without it."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from gateway import directory
from placement.models import Replica
from tests.gateway.harness import call, key, model, new_app, replica, settle

pytestmark = pytest.mark.django_db(transaction=True)

CHAT = "/v1/chat/completions"
HELLO = {"model": "llama", "messages": [{"role": "user", "content": "hello"}]}


def run(scenario):
    async def go():
        app = new_app()
        try:
            return await scenario(app)
        finally:
            await settle(app)

    return asyncio.run(go())


def test_every_request_to_an_engine_carries_its_replica_key(engines):
    r = replica(model("llama"), "http://127.0.0.1:1")
    engine = engines(api_key=r.engine_key)
    Replica.objects.filter(pk=r.pk).update(endpoint=engine.url)
    secret = key()

    async def scenario(app):
        return [await call(app, CHAT, HELLO, key=secret), await call(app, CHAT, {**HELLO, "stream": True}, key=secret)]

    answers = run(scenario)
    assert [a.status for a in answers] == [200, 200], answers[0].body
    assert engine.stats.unauthorized == 0 and engine.stats.completed == 2
    assert httpx.post(f"{engine.url}{CHAT}", json=HELLO).status_code == 401, "and nobody else is served"


def test_the_directory_knows_each_ready_engine_key_by_its_address_and_never_prints_it():
    m = model("llama")
    a, b = replica(m, "http://10.0.0.1:8001/"), replica(m, "http://10.0.0.2:8001")
    snapshot = directory.load()
    assert snapshot.engine_keys == {("10.0.0.1", 8001): a.engine_key, ("10.0.0.2", 8001): b.engine_key}
    assert a.engine_key not in repr(snapshot) and a.engine_key not in repr(snapshot.replicas)
