"""Collecting orphaned weights: deleted under the model directories, refused anywhere else."""

from __future__ import annotations

import asyncio
import hashlib
import os
import random
import shutil
from pathlib import Path

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
    assert "symbolic link" in results[3]["error"], "a symbolic link does not lead out"
    assert "model directory is never deleted" in results[4]["error"], "the directory itself is not collected"
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


# --- Hugging Face caches, nested model directories, links swapped under us ------------------------


def hf_repo(models: Path, repo: str, snapshots: dict[str, dict[str, bytes]]) -> Path:
    """``models--org--name`` as huggingface_hub lays it out: blobs by hash, snapshots of links, refs."""
    root = models / ("models--" + repo.replace("/", "--"))
    (root / "blobs").mkdir(parents=True)
    (root / "refs").mkdir()
    for rev, files in snapshots.items():
        for name, data in files.items():
            blob = hashlib.sha256(data).hexdigest()
            (root / "blobs" / blob).write_bytes(data)
            link = root / "snapshots" / rev / name
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(os.path.relpath(root / "blobs" / blob, link.parent))
        (root / "refs" / ("main" if rev == next(iter(snapshots)) else f"r-{rev}")).write_text(rev)
    return root


def disk_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def test_collecting_the_only_snapshot_of_a_cache_repo_frees_its_blobs(tmp_path):
    models = tmp_path / "models"
    repo = hf_repo(models, "org/llama", {"abc": {"config.json": b"{}", "model.safetensors": b"W" * 1000}})
    snapshot = repo / "snapshots" / "abc"
    assert collect([str(snapshot)], [models]) == [{"path": str(snapshot)}]
    assert not repo.exists(), "the whole models--… repo goes: blobs, refs and all"
    assert disk_bytes(models) == 0


def test_collecting_one_snapshot_keeps_the_blobs_another_snapshot_uses(tmp_path):
    models = tmp_path / "models"
    shared, old, new = b"{}" * 10, b"O" * 1000, b"N" * 2000
    repo = hf_repo(
        models,
        "org/llama",
        {
            "old": {"config.json": shared, "model.safetensors": old},
            "new": {"config.json": shared, "model.safetensors": new, "sub/tokenizer.json": b"t"},
        },
    )
    assert collect([str(repo / "snapshots" / "old")], [models]) == [{"path": str(repo / "snapshots" / "old")}]
    blobs = {p.name for p in (repo / "blobs").iterdir()}
    assert hashlib.sha256(old).hexdigest() not in blobs, "the blob only the old snapshot used is freed"
    assert {hashlib.sha256(d).hexdigest() for d in (shared, new, b"t")} <= blobs
    assert (repo / "snapshots" / "new" / "model.safetensors").read_bytes() == new
    assert (repo / "snapshots" / "new" / "sub" / "tokenizer.json").read_bytes() == b"t"
    assert not (repo / "snapshots" / "old").exists()
    assert not (repo / "refs" / "main").exists(), "a ref naming the collected revision goes with it"
    assert (repo / "refs" / "r-new").read_text() == "new"


def test_a_directory_holding_another_model_directory_is_never_deleted(tmp_path):
    data = tmp_path / "data"
    llama = data / "models" / "llama"
    llama.mkdir(parents=True)
    (llama / "w.gguf").write_bytes(b"x")
    results = collect([str(data / "models"), str(llama), str(data)], [data, llama])
    assert all("model directory" in r["error"] for r in results), results
    assert (llama / "w.gguf").exists()


def test_a_link_anywhere_below_the_model_directory_is_not_followed(tmp_path):
    models, elsewhere = tmp_path / "models", tmp_path / "elsewhere"
    (elsewhere / "precious").mkdir(parents=True)
    (elsewhere / "precious" / "data").write_text("keep")
    (models / "real").mkdir(parents=True)
    (models / "link").symlink_to(elsewhere)
    (results,) = collect([str(models / "link" / "precious")], [models])
    assert "symbolic link" in results["error"] and (elsewhere / "precious" / "data").exists()


def test_a_directory_swapped_for_a_link_after_the_check_is_not_followed(tmp_path, monkeypatch):
    """The check and the deletion name the same directory: a link put in its place meanwhile is refused."""
    models, elsewhere = tmp_path / "models", tmp_path / "elsewhere"
    (models / "old" / "sub").mkdir(parents=True)
    (models / "old" / "sub" / "w.bin").write_bytes(b"x")
    (elsewhere / "sub").mkdir(parents=True)
    (elsewhere / "sub" / "precious").write_text("keep")

    def swap():
        shutil.rmtree(models / "old")
        (models / "old").symlink_to(elsewhere)
        return []

    (result,) = collect([str(models / "old" / "sub")], [models], in_use=swap)
    assert (elsewhere / "sub" / "precious").exists()
    assert "symbolic link" in result["error"]


def test_weights_a_running_shard_uses_are_not_deleted(tmp_path):
    models = tmp_path / "models"
    (models / "llama").mkdir(parents=True)
    (models / "llama" / "w.gguf").write_bytes(b"x")
    asked = []

    def in_use():
        asked.append(True)
        return [models / "llama" / "w.gguf"]

    results = collect([str(models / "llama"), str(models / "llama" / "w.gguf")], [models], in_use=in_use)
    assert all("in use" in r["error"] for r in results) and (models / "llama" / "w.gguf").exists()
    assert len(asked) == 2, "asked again just before each deletion"


def test_every_part_of_a_split_gguf_goes(tmp_path):
    models = tmp_path / "models"
    models.mkdir()
    for i in (1, 2, 3):
        (models / f"big-0000{i}-of-00003.gguf").write_bytes(b"x")
    (models / "big-00001-of-00002.gguf").write_bytes(b"other split")
    (result,) = collect([str(models / "big-00001-of-00003.gguf")], [models])
    assert result == {"path": str(models / "big-00001-of-00003.gguf")}
    assert sorted(p.name for p in models.iterdir()) == ["big-00001-of-00002.gguf"]
