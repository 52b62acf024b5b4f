"""``llmgw agent`` for real: registers once, keeps its credential private, keeps its identity on restart."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import time

import pytest

from agent.agent_cmd import SettingsError, parser, settings_from
from tests import embedded
from tests.core.test_serve import Server


def test_settings_come_from_flags_then_environment_then_the_file(tmp_path):
    config = tmp_path / "agent.yaml"
    config.write_text("server: http://from-file:8000\nname: from-file\nfabrics: {north: [mlx5_0]}\n")
    args = parser().parse_args(["--config", str(config)])
    settings = settings_from(args, {"LLMGW_AGENT_NAME": "from-env"})
    assert settings.server == "http://from-file:8000" and settings.name == "from-env"
    assert settings.fabrics == {"north": ["mlx5_0"]}
    args = parser().parse_args(["--config", str(config), "--server", "https://flag:8000"])
    assert settings_from(args, {}).server == "https://flag:8000"


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("server: ftp://x\n", "http:// or https://"),
        ("server: http://x\nfabrics: [mlx5_0]\n", "map each fabric name"),
        (": : :\n", "not valid YAML"),
        ("- a\n", "mapping of settings"),
    ],
)
def test_bad_settings_say_what_is_wrong(tmp_path, text, words):
    config = tmp_path / "agent.yaml"
    config.write_text(text)
    with pytest.raises(SettingsError, match=words):
        settings_from(parser().parse_args(["--config", str(config)]), {})


def agent(server: Server, state, *extra: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLMGW_")}
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "llmgw.cli",
            "agent",
            "--server",
            f"http://{server.admin}",
            "--state-dir",
            str(state),
            "--name",
            "this-machine",
            "--no-nvml",
            *extra,
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


def wait_for(check, timeout=30.0):
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline
        time.sleep(0.3)


@pytest.mark.slow
def test_the_agent_registers_and_keeps_its_identity(tmp_path):
    server = Server(tmp_path)
    state = tmp_path / "agent-state"
    try:
        server.wait_ready()

        def nodes():
            return embedded.rows(server.data, "select name, memory_mb, credential_digest from inventory_node")

        first = agent(server, state, "--join-token", (server.data / "join-token").read_text().strip())
        wait_for(lambda: len(nodes()) == 1)
        credential = state / "credential.json"
        wait_for(credential.exists)
        assert stat.S_IMODE(credential.stat().st_mode) == 0o600
        name, memory_mb, digest = nodes()[0]
        assert name == "this-machine" and memory_mb > 0, "a CPU node with its memory"
        first.send_signal(signal.SIGTERM)
        assert first.wait(15) == 0

        # Restarted without the join token: the kept credential is enough, and the node is the same.
        again = agent(server, state)
        time.sleep(3)
        assert again.poll() is None, again.stdout.read().decode()
        assert len(nodes()) == 1 and nodes()[0][2] == digest
        again.send_signal(signal.SIGTERM)
        assert again.wait(15) == 0
    finally:
        assert server.stop() == 0


def test_an_unregistered_agent_without_a_join_token_stops_with_one_line(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "llmgw.cli", "agent", "--server", "http://127.0.0.1:9", "--state-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2
    assert "not registered yet" in result.stderr and "Traceback" not in result.stderr
