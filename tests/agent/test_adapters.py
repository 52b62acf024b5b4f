"""LoRA adapters on the agent: each engine's command line, and a running engine given one more at runtime."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest

from agent.supervisor import engines, llamacpp, sglang, vllm
from agent.supervisor.spec import BadSpec, ShardSpec
from agent.supervisor.supervisor import Supervisor

SQL = {"name": "llama-sql", "source": "hf://acme/sql"}
CHAT = {"name": "llama-chat", "source": "hf://acme/chat"}


def spec(**kw) -> ShardSpec:
    data = {"id": "r1-0", "replica": "r1", "model": "llama", "rank": 0, "engine": "vllm", "source": "", **kw}
    return ShardSpec.from_assignment(data)


def test_vllm_starts_with_lora_modules_room_and_runtime_updating(monkeypatch):
    monkeypatch.setattr(vllm, "installed_version", lambda: (0, 11, 0))
    s = spec(adapters=[SQL, CHAT])
    cmd = vllm.command(s, "/w/llama", 8001, "10.0.0.7", adapters={"llama-sql": "/a/sql", "llama-chat": "/a/chat"})
    assert "--enable-lora" in cmd
    at = cmd.index("--lora-modules")
    assert cmd[at + 1 : at + 3] == ["llama-chat=/a/chat", "llama-sql=/a/sql"]
    assert cmd[cmd.index("--max-loras") + 1] == str(vllm.LORA_SLOTS) == str(vllm.lora_slots(s))
    assert vllm.environment(s, "h", 1)["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"
    plain = spec()
    assert "--enable-lora" not in vllm.command(plain, "/w", 1, "h") and vllm.lora_slots(plain) == 0
    assert "VLLM_ALLOW_RUNTIME_LORA_UPDATING" not in vllm.environment(plain, "h", 1)


def test_the_profiles_max_loras_is_the_room_and_is_not_given_twice(monkeypatch):
    monkeypatch.setattr(vllm, "installed_version", lambda: (0, 11, 0))
    s = spec(adapters=[SQL, CHAT], engine_args=["--max-loras", "1"])
    assert vllm.lora_slots(s) == 1
    assert vllm.command(s, "/w", 1, "h", adapters={"llama-sql": "/a"}).count("--max-loras") == 1
    assert vllm.lora_slots(spec(adapters=[SQL], engine_args=["--max-loras=2"])) == 2


def test_sglang_starts_with_lora_paths_and_llamacpp_with_none():
    s = spec(engine="sglang", adapters=[SQL])
    cmd = sglang.command(s, "/w/llama", 8001, "10.0.0.7", adapters={"llama-sql": "/a/sql"})
    assert cmd[cmd.index("--lora-paths") + 1] == "llama-sql=/a/sql" and "--enable-lora" in cmd
    assert "--lora-paths" not in sglang.command(spec(engine="sglang"), "/w", 1, "h")
    # llama-cpp-python's server applies its one --lora_path to every request: its replicas serve the base only.
    cmd = llamacpp.command(spec(engine="llamacpp", adapters=[SQL]), "/w/m.gguf", 1, "h", adapters={"llama-sql": "/a"})
    assert not any("lora" in part for part in cmd)
    assert not getattr(llamacpp, "LORA", False)


@pytest.mark.parametrize(
    "adapters",
    [[{"name": "a=b", "source": "hf://x"}], [{"name": "ok", "source": ""}], ["llama-sql"], [{"name": "x y"}]],
)
def test_an_adapter_that_cannot_go_on_a_command_line_is_not_run(adapters):
    with pytest.raises(BadSpec):
        spec(adapters=adapters)


def lora_engine() -> SimpleNamespace:
    """The gateway's fake engine, serving adapters as vLLM does, standing in for vLLM."""

    def command(s, weights, port, host, adapters=None):
        cmd = [sys.executable, "-m", "tests.gateway.fake_engine", "--port", str(port), "--name", s.model, "--lora"]
        return cmd + [f"--adapter={n}={p}" for n, p in (adapters or {}).items()]

    return SimpleNamespace(
        command=command,
        serves_api=lambda s: True,
        PROBE_PATHS=("/v1/models",),
        LORA=True,
        RUNTIME_LORA=True,
        lora_slots=lambda s: 2,
    )


async def wait_until(check, timeout: float = 20):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        await asyncio.sleep(0.05)
    raise AssertionError("never happened")


def test_a_running_engine_loads_an_adapter_added_later_while_it_has_room_unloads_one_dropped_and_says_which(
    tmp_path: Path, monkeypatch
):
    monkeypatch.setitem(engines.ENGINES, "lorafake", lora_engine())
    weights = tmp_path / "weights.bin"
    weights.write_bytes(b"w")
    sources = {}
    for name in ("sql", "chat", "third"):
        (tmp_path / name).mkdir()
        sources[name] = (tmp_path / name).as_uri()
    shard = {"id": "r1-0", "replica": "r1", "rank": 0, "model": "llama", "engine": "lorafake"}
    shard["source"] = weights.as_uri()

    def adapters(*names):
        return [{"name": f"llama-{n}", "source": sources[n]} for n in names]

    def loaded(sup):
        status = sup.status()[0]
        return status.get("adapters") if status["state"] == "ready" else None

    async def scenario():
        sup = Supervisor(work_dir=tmp_path / "work", advertise_host="127.0.0.1", stop_timeout_s=5)
        sup.apply([{**shard, "adapters": adapters("sql")}])
        assert await wait_until(lambda: loaded(sup)) == ["llama-sql"]
        sup.apply([{**shard, "adapters": adapters("sql", "chat", "third")}])
        await wait_until(lambda: loaded(sup) == ["llama-chat", "llama-sql"])
        await sup.runs["r1-0"].loader
        assert loaded(sup) == ["llama-chat", "llama-sql"], "two slots: the third waits for room"
        async with httpx.AsyncClient() as client:
            listed = (await client.get(f"{sup.runs['r1-0'].endpoint}/v1/models")).json()["data"]
        assert {(m["id"], m["parent"]) for m in listed} == {
            ("llama", None),
            ("llama-sql", "llama"),
            ("llama-chat", "llama"),
        }
        assert dict((m["id"], m["root"]) for m in listed)["llama-chat"] == str(tmp_path / "chat")
        sup.apply([{**shard, "adapters": adapters("chat", "third")}])
        await wait_until(lambda: loaded(sup) == ["llama-chat", "llama-third"])
        await sup.close()

    asyncio.run(scenario())
