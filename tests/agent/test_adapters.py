"""LoRA adapters on the agent: each engine's command line, and a running engine given one more at runtime."""

from __future__ import annotations

import asyncio
import json
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


def test_sglang_starts_with_lora_paths_and_llamacpp_with_a_config_file(tmp_path: Path):
    s = spec(engine="sglang", adapters=[SQL])
    cmd = sglang.command(s, "/w/llama", 8001, "10.0.0.7", adapters={"llama-sql": "/a/sql"})
    assert cmd[cmd.index("--lora-paths") + 1] == "llama-sql=/a/sql" and "--enable-lora" in cmd
    assert "--lora-paths" not in sglang.command(spec(engine="sglang"), "/w", 1, "h")
    # llama.cpp: the base and each adapter are names in the server's config file, the profile's args in each.
    args = ["--n_ctx", "512", "--n_gpu_layers=-1", "--tensor_split", "0.5", "0.5", "--interrupt_requests", "false"]
    s = spec(engine="llamacpp", adapters=[SQL, CHAT], engine_args=args, api_key="sk-secret")
    cmd = llamacpp.command(s, "/w/m.gguf", 8001, "10.0.0.7", adapters={"llama-sql": "/a/s.gguf"}, run_dir=tmp_path)
    assert cmd[1:] == ["-m", "llama_cpp.server", "--config_file", str(tmp_path / "llamacpp.json")]
    path = tmp_path / "llamacpp.json"
    assert path.stat().st_mode & 0o777 == 0o600
    written = json.loads(path.read_text())
    assert "sk-secret" not in path.read_text() and "api_key" not in written, "the key stays in API_KEY"
    assert (written["host"], written["port"], written["interrupt_requests"]) == ("10.0.0.7", 8001, False)
    same = {"model": "/w/m.gguf", "n_ctx": 512, "n_gpu_layers": -1, "tensor_split": [0.5, 0.5]}
    assert written["models"] == [
        {**same, "model_alias": "llama", "lora_path": None},
        {**same, "model_alias": "llama-sql", "lora_path": "/a/s.gguf"},
    ]
    assert llamacpp.environment(s, "10.0.0.7", 8001)["API_KEY"] == "sk-secret"
    assert llamacpp.lora_slots(s) == 2 and llamacpp.LORA and not getattr(llamacpp, "RUNTIME_LORA", False)
    # Without adapters the command line is as it always was, and no file is written.
    plain = llamacpp.command(spec(engine="llamacpp", engine_args=args), "/w/m.gguf", 1, "h", run_dir=tmp_path / "p")
    assert plain[3:] == [
        "--interrupt_requests",
        "False",
        *args,
        "--model",
        "/w/m.gguf",
        "--model_alias",
        "llama",
        "--host",
        "h",
        "--port",
        "1",
    ]
    assert not (tmp_path / "p").exists()


def test_a_llamacpp_profile_arg_its_server_cannot_parse_fails_the_shard_saying_why(tmp_path: Path):
    s = spec(engine="llamacpp", adapters=[SQL], engine_args=["--n_ctx", "lots"])
    with pytest.raises(llamacpp.CannotStart, match=r"engine_args cannot go in llama\.cpp.s config file.*n_ctx"):
        llamacpp.command(s, "/w/m.gguf", 1, "h", adapters={"llama-sql": "/a.gguf"}, run_dir=tmp_path)
    with pytest.raises(llamacpp.CannotStart, match="unrecognized"):
        llamacpp.config(spec(engine="llamacpp", engine_args=["--no_such_setting", "1"]), "/m", "h", 1, {})
    with pytest.raises(llamacpp.NoGguf):
        llamacpp.lora_file(str(tmp_path))  # an adapter with no GGUF: the supervisor leaves it out


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


def test_a_llamacpp_shard_writes_its_config_in_its_own_directory_reports_its_gguf_adapters_and_removes_it(
    tmp_path: Path, monkeypatch
):
    """The supervisor's side: llama.cpp's command (config file included) as written, the fake engine run
    in its place; an adapter holding no GGUF is left out, the replica serving the others."""
    written = {}

    def command(s, weights, port, host, adapters=None, run_dir=None):
        llamacpp.command(s, weights, port, host, adapters=adapters, run_dir=run_dir)
        written.update(json.loads((run_dir / llamacpp.CONFIG_NAME).read_text()), run_dir=run_dir)
        return [sys.executable, "-m", "tests.gateway.fake_engine", "--port", str(port), "--name", s.model]

    monkeypatch.setitem(engines.ENGINES, "llamacppfake", SimpleNamespace(**{**vars(llamacpp), "command": command}))
    weights = tmp_path / "base"
    weights.mkdir()
    (weights / "m.gguf").write_bytes(b"g")
    (tmp_path / "sql").mkdir()
    (tmp_path / "sql" / "sql.gguf").write_bytes(b"l")
    (tmp_path / "peft").mkdir()
    (tmp_path / "peft" / "adapter_model.safetensors").write_bytes(b"s")
    adapters = [{"name": "llama-sql", "source": (tmp_path / "sql").as_uri()}]
    adapters.append({"name": "llama-peft", "source": (tmp_path / "peft").as_uri()})
    shard = {"id": "r1-0", "replica": "r1", "rank": 0, "model": "llama", "engine": "llamacppfake"}
    shard.update(source=weights.as_uri(), adapters=adapters)

    async def scenario():
        sup = Supervisor(work_dir=tmp_path / "work", advertise_host="127.0.0.1", stop_timeout_s=5)
        sup.apply([shard])
        status = await wait_until(lambda: sup.status()[0] if sup.status()[0]["state"] == "ready" else None)
        assert status["adapters"] == ["llama-sql"]
        assert written["run_dir"] == tmp_path / "work" / "shards" / "r1-0" and written["run_dir"].is_dir()
        assert [(m["model_alias"], m["lora_path"]) for m in written["models"]] == [
            ("llama", None),
            ("llama-sql", str(tmp_path / "sql" / "sql.gguf")),
        ]
        sup.apply([])
        await wait_until(lambda: not sup.runs)
        assert not written["run_dir"].exists()

    asyncio.run(scenario())
