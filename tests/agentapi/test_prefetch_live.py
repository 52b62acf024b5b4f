"""A prefetch through the agent's own HTTP path: the heartbeat answer hands it out, the agent's fetch code runs it,
its beats bring the progress back through the fast lane and the flush, and the models list shows it done."""

from __future__ import annotations

import asyncio
import time

import pytest
from rest_framework.test import APIClient

from agent.supervisor.prefetch import Prefetcher
from catalog import writes as service
from core.models import ApiToken
from inventory.models import Node
from tests import people
from tests.agentapi.agenthttp import heartbeat

pytestmark = pytest.mark.django_db


def test_an_agent_fetches_what_the_heartbeat_hands_out_and_its_beats_bring_the_progress_home(node, tmp_path):
    weights = tmp_path / "tiny.gguf"
    weights.write_bytes(b"g" * 1234)
    service.add_model(
        {
            "name": "tiny",
            "source": weights.as_uri(),
            "profiles": [{"engine": "llamacpp", "gpu_class": "cpu", "memory_gb": 1}],
        },
        actor="t",
    )
    _, secret = ApiToken.issue(people.operator("olivia"), "laptop")
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    name = Node.objects.get().name
    assert api.post("/api/v1/models/tiny/prefetch", {"nodes": [name]}, format="json").status_code == 200

    handed = heartbeat(node, {}).json()["prefetch"]
    assert handed == [{"model": "tiny", "source": weights.as_uri()}]

    async def agent() -> list[dict]:
        p = Prefetcher(fallback=tmp_path / "state")
        p.apply(handed)
        deadline = time.monotonic() + 10
        while p.status()[0]["state"] == "fetching" and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        return p.status()

    status = asyncio.run(agent())
    assert heartbeat(node, {"prefetch": status}).status_code == 200
    (tiny,) = [m for m in api.get("/api/v1/models").json() if m["name"] == "tiny"]
    (row,) = tiny["prefetch"]
    assert (row["state"], row["bytes_done"], row["bytes_total"], row["path"]) == ("done", 1234, 1234, str(weights))
    assert "prefetch" not in heartbeat(node, {}).json(), "done: handed out no more"
