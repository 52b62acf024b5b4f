"""``llmgw ctl`` as an operator runs it, against a live control plane with a simulated fleet heartbeating."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from tests.api.live import PLACE, REPO, live_fleet

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    with live_fleet(tmp_path_factory.mktemp("ctl"), "gb200-nvl72:1,h100-hgx:3@north,a100-mig:1", 22) as live:
        live.fetching = live.shell(PLACE).strip().splitlines()[-1]
        yield live


def ctl(live, *argv: str) -> subprocess.CompletedProcess:
    """A fresh process with only the environment ctl documents: LLMGW_URL and LLMGW_TOKEN."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLMGW_")}
    env.update(LLMGW_URL=live.url, LLMGW_TOKEN=live.token, HOME=str(live.server.data), COLUMNS="200")
    return subprocess.run(
        [sys.executable, "-m", "llmgw.cli", "ctl", *argv], cwd=REPO, env=env, capture_output=True, text=True, timeout=60
    )


def ok(live, *argv: str) -> str:
    done = ctl(live, *argv)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_status_sees_the_whole_fleet(live):
    out = ok(live, "status")
    assert "nodes 22: 22 ready" in out and "gb200-185g" in out and "a100-80g-mig-1g.20gb" in out
    summary = json.loads(ok(live, "status", "--json"))
    h100 = next(c for c in summary["gpus"] if c["class"] == "h100-80g")
    assert (h100["total"], h100["used"]) == (24, 3)
    assert summary["replicas"]["fetching"] == 1


def test_cordon_and_drain_change_what_status_counts(live):
    assert "hgx-002: ready → cordoned" in ok(live, "cordon", "hgx-002")
    assert "hgx-000: ready → draining" in ok(live, "drain", "hgx-000")
    nodes = {n["id"]: n for n in json.loads(ok(live, "nodes", "--json"))}
    assert (nodes["hgx-002"]["state"], nodes["hgx-000"]["state"]) == ("cordoned", "draining")
    assert "20 ready, 1 cordoned, 1 draining" in ok(live, "status")
    ok(live, "uncordon", "hgx-002")
    ok(live, "uncordon", "hgx-000")


def test_scale_and_explain(live):
    out = ok(live, "scale", "llama-8b", "0", "3", "--idle-timeout", "30m")
    assert "llama-8b: 0-3 replicas (started on demand), idle timeout 30m" in out
    model = json.loads(ok(live, "models", "--json"))[0]
    assert (model["min_replicas"], model["max_replicas"], model["idle_timeout_seconds"]) == (0, 3, 1800)
    out = ok(live, "explain", "llama")
    assert out.startswith("llama-8b: placed"), out


def test_replicas_show_the_download_in_flight(live):
    out = ok(live, "replicas", "llama-8b")
    assert live.fetching in out and "25% of 4.0 GB" in out


def test_a_tray_leaving_its_domain_shows_in_nvlink(live):
    live.fleet.loop.call_soon_threadsafe(live.fleet.sim.tray_leave, "nvl72-00-tray-04")
    deadline = time.monotonic() + 30
    while "nvl72-00-tray-04 gpu 0 fabric state In Progress" not in (out := ok(live, "nvlink")):
        assert time.monotonic() < deadline, out
        time.sleep(0.5)
    assert "17/18 nodes in" in out


def test_refusals_are_the_servers_sentence_with_a_failing_status(live):
    done = ctl(live, "drain", "no-such-node")
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.strip() == "llmgw ctl: no node named 'no-such-node'; `llmgw ctl nodes` lists them"
    done = ctl(live, "--token", "wrong", "status")
    assert done.returncode == 1 and "unknown or has been revoked" in done.stderr
