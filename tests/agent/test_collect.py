"""Collecting orphaned weights: deleted under the model directories, refused anywhere else."""

from __future__ import annotations

import asyncio
import random

from agent.collect import collect
from agent.loop import AgentLoop, Identity
from tests.agent.test_loop import Clock, FakePlane


def test_only_paths_under_a_model_directory_are_deleted(tmp_path):
    models = tmp_path / "models"
    (models / "old-model").mkdir(parents=True)
    (models / "old-model" / "w.safetensors").write_bytes(b"x")
    (models / "single.gguf").write_bytes(b"x")
    precious = tmp_path / "etc-passwd"
    precious.write_text("root")
    (models / "escape").symlink_to(tmp_path)
    results = collect(
        [
            str(models / "old-model"),
            str(models / "single.gguf"),
            str(precious),
            str(models / "escape" / "etc-passwd"),
            str(models),
            str(models / "gone"),
        ],
        [models],
    )
    assert results[0] == {"path": str(models / "old-model")} and not (models / "old-model").exists()
    assert results[1] == {"path": str(models / "single.gguf")}
    assert "not under a model directory" in results[2]["error"] and precious.exists()
    assert "not under a model directory" in results[3]["error"], "a symbolic link does not lead out"
    assert "not under a model directory" in results[4]["error"], "the directory itself is not collected"
    assert results[5] == {"path": str(models / "gone")}
    assert collect(["/x"], [])[0]["error"] == "this agent has no model directories configured"


def test_the_loop_deletes_once_and_reports_on_the_next_beat():
    plane, clock = FakePlane(), Clock()
    asked: list[list[str]] = []
    beats: list[dict] = []

    async def on_collect(paths):
        asked.append(paths)
        return [{"path": p} for p in paths]

    async def heartbeat(beat):
        plane._check("heartbeat")
        beats.append(beat)
        return {"shards": [], "collect": ["/models/old"] if len(beats) < 2 else []}

    plane.heartbeat = heartbeat

    async def report():
        return {}

    async def beat():
        return {}

    loop = AgentLoop(
        plane, Identity("n", "m"), "join", report, beat, on_collect=on_collect, rng=random.Random(1), clock=clock
    )

    async def go():
        await loop.turn()  # register
        await loop.turn()  # beat 1: told to collect
        loop.state.want_report = False
        await loop.turn()  # beat 2: reports it

    asyncio.run(go())
    assert asked == [["/models/old"]]
    assert beats[1]["collected"] == [{"path": "/models/old"}]
