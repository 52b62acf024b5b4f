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
from agent.supervisor.prefetch import Prefetcher
from agent.supervisor.spec import ShardSpec
from agent.supervisor.supervisor import ShardRun, Supervisor


def spec(**kw) -> ShardSpec:
    data = {"id": "r1-0", "replica": "r1", "model": "m", "rank": 0, "engine": "fake", "source": "", **kw}
    return ShardSpec.from_assignment(data)


# --- command lines ------------------------------------------------------------------


def last(cmd: list[str], flag: str) -> str:
    """The value an argparse command line ends up with: the last one given."""
    return cmd[len(cmd) - 1 - cmd[::-1].index(flag) + 1]


def test_vllm_command_line(monkeypatch):
    monkeypatch.setattr(vllm, "installed_version", lambda: (0, 11, 0))
    args = ["--max-model-len", "8192", "--host", "0.0.0.0", "--enable-log-requests"]
    s = spec(engine="vllm", tp=4, engine_args=args, api_key="k-secret")
    cmd = vllm.command(s, "/w/llama", 8001, "10.0.0.7")
    assert cmd[:3] == ["vllm", "serve", "/w/llama"] and cmd[3:8] == args
    assert last(cmd, "--port") == "8001" and last(cmd, "--tensor-parallel-size") == "4"
    assert last(cmd, "--host") == "10.0.0.7", "bound to the advertised address whatever the profile says"
    assert cmd.index("--no-enable-log-requests") > cmd.index("--enable-log-requests"), "prompts stay out of the log"
    assert "k-secret" not in " ".join(cmd) and "--nnodes" not in cmd
    assert vllm.environment(s, "10.0.0.7", 8001) == {"VLLM_API_KEY": "k-secret"}
    assert vllm.environment(spec(engine="vllm"), "h", 1) == {"VLLM_API_KEY": None}, "the node's own is not used"


@pytest.mark.parametrize(
    ("version", "flag"),
    [
        ((0, 6, 3), "--disable-log-requests"),
        ((0, 10, 1), "--no-enable-log-requests"),
        (None, "--no-enable-log-requests"),
    ],
)
def test_vllm_is_told_to_keep_requests_out_of_its_log_in_the_words_its_version_knows(version, flag):
    assert vllm.quiet_flag(version) == flag


def test_sglang_and_llamacpp_bind_the_address_and_want_the_key(tmp_path):
    s = spec(engine="sglang", api_key="k-secret", engine_args=["--port", "1"])
    cmd = sglang.command(s, "/w", 8001, "10.0.0.7")
    assert last(cmd, "--host") == "10.0.0.7" and last(cmd, "--port") == "8001"
    assert last(cmd, "--api-key") == "k-secret" and "--log-requests" not in cmd
    (tmp_path / "m.gguf").write_bytes(b"x")
    s = spec(engine="llamacpp", api_key="k-secret")
    cmd = llamacpp.command(s, str(tmp_path), 9000, "10.0.0.7")
    assert last(cmd, "--host") == "10.0.0.7" and "k-secret" not in cmd
    assert last(cmd, "--interrupt_requests") == "False", "a new request must not cut off the stream in progress"
    assert llamacpp.environment(s, "10.0.0.7", 9000) == {
        "HOST": "10.0.0.7",  # llama_cpp.server lets HOST and PORT beat its flags
        "PORT": "9000",
        "CONFIG_FILE": None,
        "API_KEY": "k-secret",
    }


def test_multi_node_shards_get_rank_world_and_master():
    env = {"LLMGW_NODE_RANK": "1", "LLMGW_NNODES": "2", "LLMGW_MASTER_NODE": "tray-00", "NCCL_MNNVL_ENABLE": "1"}
    s = spec(engine="vllm", rank=1, tp=8, env=env)
    assert s.distributed_env() == {
        "NODE_RANK": "1",
        "WORLD_SIZE": "2",
        "MASTER_ADDR": "tray-00",
        "MASTER_PORT": "29500",
    }
    cmd = vllm.command(s, "/w", 8001, "h")
    assert cmd[cmd.index("--node-rank") + 1] == "1" and "--headless" in cmd and not vllm.serves_api(s)
    cmd = sglang.command(s, "/w", 8001, "h")
    assert cmd[cmd.index("--dist-init-addr") + 1] == "tray-00:29500" and cmd[cmd.index("--nnodes") + 1] == "2"


def test_llamacpp_takes_the_gguf_inside_a_directory(tmp_path):
    (tmp_path / "small.gguf").write_bytes(b"x")
    (tmp_path / "big.gguf").write_bytes(b"xxxx")
    cmd = llamacpp.command(spec(engine="llamacpp"), str(tmp_path), 9000, "10.0.0.7")
    assert cmd[1:3] == ["-m", "llama_cpp.server"]
    assert cmd[cmd.index("--model") + 1] == str(tmp_path / "big.gguf")
    assert cmd[cmd.index("--host") + 1] == "10.0.0.7" and cmd[cmd.index("--port") + 1] == "9000"
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(llamacpp.NoGguf, match=r"no \.gguf"):
        llamacpp.command(spec(engine="llamacpp"), str(empty), 9000, "h")


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

    def command(s, weights, port, host):
        return [sys.executable, "-m", "agent.simulator.engine", "--model", s.model, "--port", str(port)]

    return SimpleNamespace(command=command, serves_api=lambda s: True, PROBE_PATHS=("/health",))


def script_engine(code: str) -> SimpleNamespace:
    def command(s, weights, port, host):
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
        sup = Supervisor(work_dir=tmp_path / "work", advertise_host="127.0.0.1", stop_timeout_s=5)
        sup.apply([assignment(tmp_path, env={"CUDA_VISIBLE_DEVICES": ""})])
        assert sup.status()[0]["state"] in ("fetching", "starting")
        ready = await wait_for(sup, "ready")
        assert ready["endpoint"].startswith("http://127.0.0.1:")
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


def test_a_start_is_timed_in_phases_and_a_download_is_not_local(tmp_path, monkeypatch, file_server):
    """fetch_s while fetching, then load_s while the engine loads; fixed once ready; weights_local as it was."""
    monkeypatch.setitem(engines.ENGINES, "fake", fake_engine(tmp_path))

    async def scenario(source: str) -> dict:
        sup = Supervisor(work_dir=tmp_path / "work", advertise_host="127.0.0.1", stop_timeout_s=5)
        sup.apply([{**assignment(tmp_path), "source": source}])
        assert set(sup.status()[0]["phases"]) <= {"fetch_s", "load_s", "weights_local"}
        starting = await wait_for(sup, "starting")
        assert starting["phases"]["load_s"] < 5
        ready = (await wait_for(sup, "ready"))["phases"]
        await asyncio.sleep(0.3)
        assert sup.status()[0]["phases"] == ready, "a finished start no longer moves"
        assert ready["load_s"] > 0 and ready["fetch_s"] >= 0
        sup.apply([])
        await sup.runs["r1-0"].stopper
        return ready

    assert run(scenario((tmp_path / "weights.bin").as_uri()))["weights_local"] is True
    downloaded = run(scenario(f"{file_server}/with-length.bin"))
    assert downloaded["weights_local"] is False
    assert run(scenario(f"{file_server}/with-length.bin"))["weights_local"] is True, "on disk since the last one"


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


@pytest.mark.parametrize(
    ("engine", "extra"),
    [
        ("vllm", {"env": {"CUDA_INJECTION64_PATH": "/tmp/evil.so"}}),
        ("vllm", {"env": {"HF_ENDPOINT": "http://evil.example"}}),
        ("vllm", {"engine_args": ["--allowed-local-media-path", "/"]}),
        ("vllm", {"engine_args": ["--tokenizer", "other/repo", "--trust-remote-code"]}),
        ("sglang", {"env": {"OPENSSL_CONF": "/tmp/o.cnf"}}),
        ("llamacpp", {"engine_args": ["--lora_path", "/models/adapter.gguf"]}),
        ("fake", {"env": {"VLLM_PLUGINS": "evil"}}),
    ],
)
def test_the_agent_starts_nothing_outside_the_allow_list_whatever_the_control_plane_sends(
    tmp_path, monkeypatch, engine, extra
):
    """Defence in depth: an older or tampered control plane's assignment fails the shard before any fetch."""
    monkeypatch.setitem(engines.ENGINES, "fake", fake_engine(tmp_path))
    fetched = []

    async def no_fetch(*args):
        fetched.append(args)
        raise fetch.FetchError("fetched")

    monkeypatch.setattr("agent.supervisor.supervisor.fetch", no_fetch)

    async def scenario():
        sup = Supervisor(work_dir=tmp_path / "work", advertise_host="127.0.0.1")
        placed = {"CUDA_VISIBLE_DEVICES": "0", "LLMGW_NODE_RANK": "0", "LLMGW_NNODES": "1", "LLMGW_MASTER_NODE": "a"}
        sup.apply([assignment(tmp_path, engine=engine, **{**extra, "env": {**placed, **extra.get("env", {})}})])
        failed = await wait_for(sup, "failed", timeout=5)
        assert failed["error"].startswith("not started: ") and " is refused: " in failed["error"]
        assert fetched == [] and sup.runs["r1-0"].proc is None

    run(scenario())


# --- the engine's address and key ---------------------------------------------------------

KEYED_ENGINE = """
import http.server, os, sys
host, port, key = sys.argv[1], int(sys.argv[2]), os.environ["FAKE_KEY"]
print("engine args: api_key=" + key, flush=True)  # as SGLang prints its arguments


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        ok = self.headers.get("Authorization") == "Bearer " + key
        self.send_response(200 if ok else 401)
        self.end_headers()

    def log_message(self, *args):
        pass


http.server.HTTPServer((host, port), Handler).serve_forever()
"""


def keyed_engine() -> SimpleNamespace:
    """Listens where it is told and wants the key, like vLLM given --host and VLLM_API_KEY."""

    def command(s, weights, port, host):
        return [sys.executable, "-c", KEYED_ENGINE, host, str(port)]

    def environment(s, host, port):
        return {"FAKE_KEY": s.api_key}

    return SimpleNamespace(
        command=command, environment=environment, serves_api=lambda s: True, PROBE_PATHS=("/v1/models",)
    )


def test_an_engine_listens_on_the_advertised_address_only_and_wants_the_replica_key(tmp_path, monkeypatch):
    monkeypatch.setitem(engines.ENGINES, "fake", keyed_engine())
    key = "k-0123456789abcdef"

    async def scenario():
        sup = Supervisor(work_dir=tmp_path / "work", advertise_host="127.0.0.1", stop_timeout_s=5)
        sup.apply([assignment(tmp_path, api_key=key)])
        ready = await wait_for(sup, "ready")
        port = sup.runs["r1-0"].port
        async with httpx.AsyncClient() as client:
            assert (await client.get(f"{ready['endpoint']}/v1/models")).status_code == 401
            auth = {"Authorization": f"Bearer {key}"}
            assert (await client.get(f"{ready['endpoint']}/v1/models", headers=auth)).status_code == 200
            with pytest.raises(httpx.ConnectError):
                await client.get(f"http://127.0.0.2:{port}/v1/models", headers=auth)
        sent = repr(sup.status())
        assert key not in sent and "api_key=[key]" in sent, "the key is blanked out of what the node reports"
        assert key in (tmp_path / "work" / "logs" / "r1-0.log").read_text(), "the log on the node is whole"
        assert key not in repr(sup.runs["r1-0"].spec)
        await sup.close()

    run(scenario())


@pytest.mark.parametrize("shard_id", ["../../escape", "a/b", ".hidden", "x" * 81, "r1-0\nforged"])
def test_a_shard_id_that_could_name_a_path_is_not_run(tmp_path, monkeypatch, shard_id):
    monkeypatch.setitem(engines.ENGINES, "fake", fake_engine(tmp_path))

    async def scenario():
        sup = Supervisor(work_dir=tmp_path / "work", advertise_host="127.0.0.1")
        sup.apply([assignment(tmp_path, id=shard_id), assignment(tmp_path, id="r2-0", rank="zero")])
        sup.apply([assignment(tmp_path, id=shard_id)])
        assert sup.runs == {} and sup.status() == []
        assert len(sup.refused) == 2, "each refusal is logged once, not at every heartbeat"

    run(scenario())
    assert not (tmp_path / "escape.log").exists() and not (tmp_path / "work").exists()


def test_the_weights_a_shard_uses_or_fetches_are_in_use(tmp_path):
    async def scenario():
        sup = Supervisor(work_dir=tmp_path / "work", model_dirs=[tmp_path / "models"], advertise_host="h")
        sup.runs["a-0"] = ShardRun(spec(id="a-0", source="hf://org/llama@main"))
        sup.runs["b-0"] = ShardRun(spec(id="b-0", source="file:///models/x.gguf"), weights=Path("/models/x.gguf"))
        return sup.weights_in_use()

    assert run(scenario()) == [
        tmp_path / "models" / "hf" / "models--org--llama",
        Path("/models/x.gguf"),
        Path("/models/x.gguf"),
    ]


# --- prefetching ----------------------------------------------------------------------


async def prefetched(prefetcher: Prefetcher, state: str, timeout: float = 20) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = prefetcher.status()
        if status and status[0]["state"] == state:
            return status[0]
        await asyncio.sleep(0.02)
    raise AssertionError(f"never {state}: {prefetcher.status()}")


def test_a_prefetch_downloads_with_progress_into_the_dir_a_shard_fetches_from(tmp_path, file_server):
    url = f"{file_server}/with-length.bin"
    done: list[bool] = []

    async def scenario():
        p = Prefetcher(model_dirs=[tmp_path / "models"], fallback=tmp_path / "state", on_done=lambda: done.append(True))
        p.apply([{"model": "llama", "source": url}])
        p.apply([{"model": "llama", "source": url}])  # the next answer lists it again: not fetched twice
        status = await prefetched(p, "done")
        assert status["bytes_done"] == status["bytes_total"] == 300_000
        assert Path(status["path"]).read_bytes() == _Files.payload
        assert Path(status["path"]).is_relative_to(tmp_path / "models") and p.in_use() == [Path(status["path"])]
        # A shard started later finds the weights where the prefetch put them, and does not fetch again.
        again = fetch.Progress(url)
        assert await fetch.fetch(url, tmp_path / "models", again) == Path(status["path"])
        p.apply([])  # the control plane stored the end: forgotten
        assert p.status() == [] and done == [True]

    run(scenario())


def test_a_prefetch_that_fails_says_why_and_one_no_longer_asked_for_is_cancelled(tmp_path):
    async def scenario():
        gate = asyncio.Event()

        async def slow(source, into, progress):
            progress.bytes_done = 5
            await gate.wait()
            return into / "never"

        p = Prefetcher(fallback=tmp_path, fetcher=slow)
        p.apply([{"model": "big", "source": "https://example.invalid/big.gguf"}])
        await asyncio.sleep(0.05)
        assert p.status() == [
            {"model": "big", "source": "https://example.invalid/big.gguf", "state": "fetching", "bytes_done": 5}
        ]
        task = p.runs[("big", "https://example.invalid/big.gguf")].task
        p.apply([])
        await asyncio.sleep(0.05)
        assert task.cancelled() and p.status() == []

        bad = Prefetcher(fallback=tmp_path)
        bad.apply([{"model": "gone", "source": (tmp_path / "nope").as_uri()}, {"model": "odd"}, "junk"])
        status = await prefetched(bad, "failed")
        assert status["model"] == "gone" and "does not exist" in status["error"]
        assert len(bad.status()) == 1, "an entry without a source is ignored"

    run(scenario())
