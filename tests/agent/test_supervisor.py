"""The agent's shard supervisor: weights fetched, engines started, probed, failed, stopped.

Engines here are real processes: the simulator's fake engine run as a
command, or a few lines of Python that crash or ignore SIGTERM.
"""

from __future__ import annotations

import asyncio
import http.server
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest

from agent.supervisor import engines, fetch, llamacpp, sglang, vllm
from agent.supervisor.spec import ShardSpec
from agent.supervisor.supervisor import Supervisor


def spec(**kw) -> ShardSpec:
    data = {"id": "r1-0", "replica": "r1", "model": "m", "rank": 0, "engine": "fake", "source": "", **kw}
    return ShardSpec.from_assignment(data)


# --- command lines ------------------------------------------------------------------


def test_vllm_command_line():
    cmd = vllm.command(spec(engine="vllm", tp=4, engine_args=["--max-model-len", "8192"]), "/w/llama", 8001)
    assert cmd[:3] == ["vllm", "serve", "/w/llama"]
    assert cmd[cmd.index("--port") + 1] == "8001" and cmd[cmd.index("--tensor-parallel-size") + 1] == "4"
    assert cmd[-2:] == ["--max-model-len", "8192"] and "--nnodes" not in cmd


def test_multi_node_shards_get_rank_world_and_master():
    env = {"LLMGW_NODE_RANK": "1", "LLMGW_NNODES": "2", "LLMGW_MASTER_NODE": "tray-00", "NCCL_MNNVL_ENABLE": "1"}
    s = spec(engine="vllm", rank=1, tp=8, env=env)
    assert s.distributed_env() == {
        "NODE_RANK": "1",
        "WORLD_SIZE": "2",
        "MASTER_ADDR": "tray-00",
        "MASTER_PORT": "29500",
    }
    cmd = vllm.command(s, "/w", 8001)
    assert cmd[cmd.index("--node-rank") + 1] == "1" and "--headless" in cmd and not vllm.serves_api(s)
    cmd = sglang.command(s, "/w", 8001)
    assert cmd[cmd.index("--dist-init-addr") + 1] == "tray-00:29500" and cmd[cmd.index("--nnodes") + 1] == "2"


def test_llamacpp_takes_the_gguf_inside_a_directory(tmp_path):
    (tmp_path / "small.gguf").write_bytes(b"x")
    (tmp_path / "big.gguf").write_bytes(b"xxxx")
    cmd = llamacpp.command(spec(engine="llamacpp"), str(tmp_path), 9000)
    assert cmd[1:3] == ["-m", "llama_cpp.server"]
    assert cmd[cmd.index("--model") + 1] == str(tmp_path / "big.gguf")
    assert cmd[cmd.index("--host") + 1] == "0.0.0.0" and cmd[cmd.index("--port") + 1] == "9000"
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(llamacpp.NoGguf, match=r"no \.gguf"):
        llamacpp.command(spec(engine="llamacpp"), str(empty), 9000)


# --- fetching -------------------------------------------------------------------------


def run(coro):
    return asyncio.run(coro)


def test_a_local_file_is_used_where_it_is(tmp_path):
    weights = tmp_path / "m.gguf"
    weights.write_bytes(b"0123456789")
    progress = fetch.Progress(source=weights.as_uri())
    assert run(fetch.fetch(weights.as_uri(), tmp_path / "dl", progress)) == weights
    assert progress.as_status() == {"source": weights.as_uri(), "bytes_done": 10, "bytes_total": 10}
    with pytest.raises(fetch.FetchError, match="does not exist"):
        run(fetch.fetch((tmp_path / "nope").as_uri(), tmp_path, fetch.Progress("x")))


class _Files(http.server.BaseHTTPRequestHandler):
    payload = b"w" * 300_000

    def do_GET(self):
        self.send_response(200)
        if self.path.endswith("/with-length.bin"):
            self.send_header("Content-Length", str(len(self.payload)))
        else:
            self.send_header("Connection", "close")  # no length: the body ends when the connection does
        self.end_headers()
        self.wfile.write(self.payload)

    def log_message(self, *args):
        pass


@pytest.fixture
def file_server():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Files)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_a_download_reports_bytes_and_total_or_bytes_only(tmp_path, file_server):
    sized = fetch.Progress("sized")
    path = run(fetch.fetch(f"{file_server}/with-length.bin", tmp_path, sized))
    assert path.read_bytes() == _Files.payload and sized.as_status()["bytes_total"] == 300_000
    unsized = fetch.Progress("unsized")
    run(fetch.fetch(f"{file_server}/no-length.bin", tmp_path, unsized))
    assert unsized.bytes_done == 300_000 and "bytes_total" not in unsized.as_status()
    # Already on disk: not fetched again.
    again = fetch.Progress("again")
    assert run(fetch.fetch(f"{file_server}/with-length.bin", tmp_path, again)) == path


def test_hf_without_huggingface_hub_says_so(tmp_path, monkeypatch):
    monkeypatch.setattr(fetch.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(fetch.FetchError, match=r"hf:// needs huggingface_hub"):
        run(fetch.fetch("hf://org/name", tmp_path, fetch.Progress("hf://org/name")))


# --- supervising ----------------------------------------------------------------------


def fake_engine(tmp_path: Path) -> SimpleNamespace:
    """The simulator's fake engine, as a command line, standing in for vLLM."""

    def command(s, weights, port):
        return [sys.executable, "-m", "agent.simulator.engine", "--model", s.model, "--port", str(port)]

    return SimpleNamespace(command=command, serves_api=lambda s: True, PROBE_PATHS=("/health",))


def script_engine(code: str) -> SimpleNamespace:
    def command(s, weights, port):
        return [sys.executable, "-c", code]

    return SimpleNamespace(command=command, serves_api=lambda s: True, PROBE_PATHS=("/health",))


async def wait_for(supervisor: Supervisor, state: str, timeout: float = 20) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = supervisor.status()
        if status and status[0]["state"] == state:
            return status[0]
        await asyncio.sleep(0.05)
    raise AssertionError(f"never {state}: {supervisor.status()}")


def assignment(tmp_path: Path, **kw) -> dict:
    weights = tmp_path / "weights.bin"
    weights.write_bytes(b"w")
    return {"id": "r1-0", "replica": "r1", "rank": 0, "model": "m", "engine": "fake", "source": weights.as_uri(), **kw}


def test_a_shard_starts_answers_and_stops_gracefully(tmp_path, monkeypatch):
    monkeypatch.setitem(engines.ENGINES, "fake", fake_engine(tmp_path))

    async def scenario():
        sup = Supervisor(work_dir=tmp_path / "work", advertise_host="node-7.example", stop_timeout_s=5)
        sup.apply([assignment(tmp_path, env={"CUDA_VISIBLE_DEVICES": ""})])
        assert sup.status()[0]["state"] in ("fetching", "starting")
        ready = await wait_for(sup, "ready")
        assert ready["endpoint"].startswith("http://node-7.example:")
        assert ready["fetch"]["bytes_done"] == ready["fetch"]["bytes_total"] == 1
        port = sup.runs["r1-0"].port
        async with httpx.AsyncClient() as client:
            answer = await client.post(
                f"http://127.0.0.1:{port}/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]}
            )
        assert answer.json()["usage"]["prompt_tokens"] == 1
        proc = sup.runs["r1-0"].proc
        sup.apply([])
        assert sup.status()[0]["state"] == "stopping"
        await sup.runs["r1-0"].stopper
        assert sup.status() == [] and proc.returncode == -15, "stopped by SIGTERM"

    run(scenario())


def test_an_engine_that_exits_fails_with_its_log(tmp_path, monkeypatch):
    monkeypatch.setitem(
        engines.ENGINES, "fake", script_engine("print('CUDA error: out of memory'); raise SystemExit(3)")
    )

    async def scenario():
        sup = Supervisor(work_dir=tmp_path / "work", advertise_host="h")
        sup.apply([assignment(tmp_path)])
        failed = await wait_for(sup, "failed")
        assert "status 3" in failed["error"]
        assert "CUDA error: out of memory" in failed["log_tail"]
        assert (tmp_path / "work" / "logs" / "r1-0.log").exists(), "the log is kept"
        sup.apply([assignment(tmp_path)])
        assert sup.status()[0]["state"] == "failed", "not restarted by the agent"

    run(scenario())


def test_an_engine_that_ignores_sigterm_is_killed(tmp_path, monkeypatch):
    code = (
        "import signal, time, http.server, os, sys\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "print('ignoring', 'SIGTERM', flush=True)\n"
        "time.sleep(60)\n"
    )
    monkeypatch.setitem(engines.ENGINES, "fake", script_engine(code))

    async def scenario():
        sup = Supervisor(work_dir=tmp_path / "work", advertise_host="h", stop_timeout_s=0.5, start_timeout_s=30)
        sup.apply([assignment(tmp_path)])
        await wait_for(sup, "starting")
        run_ = sup.runs["r1-0"]
        # The log's first line is the command itself; the marker is what the engine prints.
        while "ignoring SIGTERM" not in "".join(sup.status()[0].get("log_tail", [])):
            await asyncio.sleep(0.05)
        started = time.monotonic()
        sup.apply([])
        await run_.stopper
        assert run_.proc.returncode == -9, "SIGKILL after the timeout"
        assert 0.4 < time.monotonic() - started < 10

    run(scenario())


def test_an_unknown_engine_or_bad_source_fails_the_shard(tmp_path):
    async def scenario():
        sup = Supervisor(work_dir=tmp_path, advertise_host="h")
        sup.apply([{"id": "a-0", "replica": "a", "rank": 0, "engine": "tensorrt", "source": "file:///x"}])
        sup.apply(
            [
                {"id": "a-0", "replica": "a", "rank": 0, "engine": "tensorrt", "source": "file:///x"},
                {"id": "b-0", "replica": "b", "rank": 0, "engine": "vllm", "source": "ftp://x"},
            ]
        )
        await asyncio.sleep(0.2)
        by_id = {s["id"]: s for s in sup.status()}
        assert "tensorrt" in by_id["a-0"]["error"] and by_id["a-0"]["state"] == "failed"
        assert "not hf://" in by_id["b-0"]["error"] and by_id["b-0"]["state"] == "failed"

    run(scenario())
