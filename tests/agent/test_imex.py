"""IMEX: the two real ``nvidia-imex-ctl -N`` captures, the state verdicts, and mangled text."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.discovery import imex
from agent.discovery.errors import DiscoveryError
from agent.discovery.sources import Sources
from agent.discovery.tools import ToolOutput
from tests.captures import capture, read

GB200 = "nvidia-imex-ctl-N_gb200-nvl72_p6e_18-nodes_up.txt"
GH200 = "nvidia-imex-ctl-N_gh200_1-node_up.txt"


# --- the captures ---------------------------------------------------------------------------------------------------


def test_gb200_nvl72_has_eighteen_ready_nodes_all_connected():
    status = imex.parse_imex_status(read(GB200))
    assert status["domain_state"] == "UP"
    assert [n["index"] for n in status["nodes"]] == list(range(18))
    assert {n["status"] for n in status["nodes"]} == {"READY"}
    assert {n["version"] for n in status["nodes"]} == {"570.172"}
    assert status["nodes"][0]["address"] == "172.31.48.81"
    assert status["nodes"][17]["address"] == "172.31.56.47"
    assert len(status["matrix"]) == 18
    assert all(set(row.values()) == {"C"} and len(row) == 18 for row in status["matrix"].values())
    # The newer legend adds the two mismatch codes.
    assert status["legend"]["!V!"].startswith("Version mismatch")
    assert status["legend"]["!M!"].startswith("Node map mismatch")
    assert status["legend"]["C"] == "Connected"


def test_gh200_single_node_without_version_column():
    status = imex.parse_imex_status(read(GH200))
    assert status["domain_state"] == "UP"
    assert status["nodes"] == [{"index": 0, "address": "10.136.206.48", "status": "READY"}]
    assert status["matrix"] == {0: {0: "C"}}
    assert "!V!" not in status["legend"]


def test_single_node_is_this_node_so_it_is_up():
    verdict = imex.judge_status(imex.parse_imex_status(read(GH200)))
    assert verdict["state"] == "up"
    assert verdict["node_status"] == "READY"
    assert verdict["problems"] == []


def test_eighteen_nodes_find_this_node_by_address():
    verdict = imex.judge_status(imex.parse_imex_status(read(GB200)), ["127.0.0.1", "172.31.52.239"])
    assert verdict["state"] == "up"
    assert verdict["node_status"] == "READY"
    assert len(verdict["nodes"]) == 18


def test_eighteen_nodes_without_our_address_still_up_when_all_ready():
    verdict = imex.judge_status(imex.parse_imex_status(read(GB200)), ["10.0.0.1"])
    assert verdict["state"] == "up"
    assert "node_status" not in verdict  # unknown, not invented
    assert verdict["problems"] == []


# --- verdicts on edited copies of the real text ---------------------------------------------------------------------


def _gb200_with(node: int, status: str = "READY", row_code: tuple[int, int, str] | None = None, domain="UP") -> str:
    lines = read(GB200).splitlines()
    out = []
    for line in lines:
        if line.startswith(f"Node #{node} ") and status != "READY":
            line = line.replace("READY                ", f"{status:<21}")
        if line.startswith("Domain State:"):
            line = f"Domain State: {domain}"
        out.append(line)
    text = "\n".join(out) + "\n"
    if row_code:
        src, dst, code = row_code
        status_lines = text.splitlines()
        for i, line in enumerate(status_lines):
            cells = line.split()
            if cells and cells[0] == str(src) and len(cells) == 19:
                cells[dst + 1] = code
                status_lines[i] = "       " + "   ".join(cells)
        text = "\n".join(status_lines) + "\n"
    return text


def test_this_node_unavailable_is_down_with_the_reason():
    text = _gb200_with(3, "UNAVAILABLE")
    verdict = imex.judge_status(imex.parse_imex_status(text), ["172.31.49.228"])
    assert verdict["state"] == "down"
    assert verdict["node_status"] == "UNAVAILABLE"
    assert any("UNAVAILABLE, not READY" in p for p in verdict["problems"])


def test_other_node_unavailable_does_not_make_this_node_down():
    verdict = imex.judge_status(imex.parse_imex_status(_gb200_with(3, "UNAVAILABLE")), ["172.31.48.81"])
    assert verdict["state"] == "up"


def test_domain_down_is_down():
    verdict = imex.judge_status(imex.parse_imex_status(_gb200_with(0, domain="DOWN")), ["172.31.48.81"])
    assert verdict["state"] == "down"
    assert "IMEX domain state is DOWN, not UP" in verdict["problems"]


def test_a_broken_link_from_this_node_is_named_with_the_legend():
    text = _gb200_with(0, row_code=(0, 5, "!V!"))
    verdict = imex.judge_status(imex.parse_imex_status(text), ["172.31.48.81"])
    assert any("node #5 (172.31.50.44) is !V! (Version mismatch" in p for p in verdict["problems"])


def test_version_spread_is_a_problem():
    text = read(GB200).replace(
        "172.31.56.47    - READY                - Version: 570.172", "172.31.56.47 - READY - Version: 570.86"
    )
    verdict = imex.judge_status(imex.parse_imex_status(text), ["172.31.48.81"])
    assert "IMEX versions differ across the domain: 570.172 on 17 nodes, 570.86 on 1 node" in verdict["problems"]


# --- garbled text ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "",
        "Connection refused\n",
        read(GB200).split("Domain State")[0],  # truncated before the verdict
        read(GB200).replace("Node #4   - 172.31.50.39", "Node #4 garbage"),
        read(GB200).replace("       9        C   C   C", "       9        C"),  # short matrix row
        read(GH200).replace("Node #0   - 10.136.206.48   - READY\n", ""),
    ],
)
def test_garbled_status_is_a_discovery_error(text):
    with pytest.raises(DiscoveryError):
        imex.parse_imex_status(text)


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_mangled_captures_give_a_result_or_discovery_error(data):
    text = read(data.draw(st.sampled_from([GB200, GH200])))
    lines = text.splitlines()
    start = data.draw(st.integers(0, len(lines)))
    end = data.draw(st.integers(start, len(lines)))
    noise = data.draw(st.text(max_size=40))
    mangled = "\n".join([*lines[:start], noise, *lines[end:]])
    try:
        status = imex.parse_imex_status(mangled)
    except DiscoveryError:
        return
    imex.judge_status(status, ["172.31.48.81"])


@settings(max_examples=150, deadline=None)
@given(st.text())
def test_any_text_gives_a_result_or_discovery_error(text):
    with contextlib.suppress(DiscoveryError):
        imex.parse_imex_status(text)


# --- the collector on a fake node -----------------------------------------------------------------------------------


def _tree(tmp_path: Path, *, daemon: bool, channels: tuple[int, ...] = (), config: bool = False) -> Sources:
    proc, dev, etc = tmp_path / "proc", tmp_path / "dev", tmp_path / "etc"
    for pid, comm in ((1, "systemd"), (77, "nvidia-imex-ctl")):
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "comm").write_text(comm + "\n")
    if daemon:
        (proc / "4242").mkdir()
        (proc / "4242" / "comm").write_text("nvidia-imex\n")
    (proc / "self").mkdir()
    if channels:
        (dev / imex.CHANNELS_DIR).mkdir(parents=True)
        for n in channels:
            (dev / imex.CHANNELS_DIR / f"channel{n}").write_text("")
    else:
        dev.mkdir()
    if config:
        (etc / "nvidia-imex").mkdir(parents=True)
        (etc / "nvidia-imex" / "config.cfg").write_text("SERVER_PORT=50000\n")
    else:
        etc.mkdir()
    return Sources(proc_root=proc, dev_root=dev, etc_root=etc)


def _ctl(stdout=None, error=None):
    calls = []

    def run(argv):
        calls.append(argv)
        return ToolOutput(stdout=stdout, error=error, exit_code=0 if error is None else 1)

    run.calls = calls
    return run


def test_not_installed_is_normal_and_no_problem(tmp_path):
    result = imex.collect_imex(_tree(tmp_path, daemon=False), _ctl(error="nvidia-imex-ctl not found"))
    assert result == {"state": "not installed", "running": False, "channels": [], "problems": []}


def test_installed_but_not_running_is_a_problem(tmp_path):
    sources = _tree(tmp_path, daemon=False, config=True)
    result = imex.collect_imex(sources, _ctl(error="nvidia-imex-ctl not found"))
    assert result["state"] == "not running"
    assert result["running"] is False
    assert result["problems"]


def test_ctl_present_but_failing_without_daemon_is_not_running(tmp_path):
    run = _ctl(error="nvidia-imex-ctl exited with status 1: connect failed")
    result = imex.collect_imex(_tree(tmp_path, daemon=False), run)
    assert result["state"] == "not running"
    assert run.calls[0][:2] == ["nvidia-imex-ctl", "-N"]


def test_running_up_with_channel_from_the_live_tool(tmp_path):
    result = imex.collect_imex(_tree(tmp_path, daemon=True, channels=(0,)), _ctl(stdout=read(GH200)))
    assert result["state"] == "up"
    assert result["running"] is True
    assert result["domain_state"] == "UP"
    assert result["node_status"] == "READY"
    assert result["channels"] == [0]
    assert result["problems"] == []


def test_up_without_a_channel_says_so(tmp_path):
    result = imex.collect_imex(_tree(tmp_path, daemon=True), _ctl(stdout=read(GH200)))
    assert result["state"] == "up"
    assert result["channels"] == []
    assert any("no channel" in p for p in result["problems"])


def test_running_but_ctl_missing_is_unknown(tmp_path):
    result = imex.collect_imex(_tree(tmp_path, daemon=True), _ctl(error="nvidia-imex-ctl not found"))
    assert result["state"] == "unknown"
    assert result["running"] is True
    assert "nvidia-imex-ctl not found" in result["problems"][0]
    assert "domain_state" not in result


def test_running_with_garbled_answer_is_unknown(tmp_path):
    result = imex.collect_imex(_tree(tmp_path, daemon=True), _ctl(stdout="segfault\n"))
    assert result["state"] == "unknown"
    assert result["problems"][0].startswith("IMEX status not understood")


def test_capture_replaces_the_tool_and_addresses_are_asked_for_many_nodes(tmp_path):
    sources = _tree(tmp_path, daemon=False, channels=(0, 1, 10))
    sources = Sources(**{**sources.__dict__, "imex_status": capture(GB200)})
    run = _ctl(error="must not be called")
    asked = []

    def addresses():
        asked.append(True)
        return ["172.31.55.59"]

    result = imex.collect_imex(sources, run, addresses)
    assert run.calls == []
    assert asked == [True]
    assert result["state"] == "up"
    assert result["running"] is True  # the capture is the daemon's own answer
    assert result["channels"] == [0, 1, 10]
    assert len(result["nodes"]) == 18


def test_relocated_etc_root_passes_its_config(tmp_path):
    run = _ctl(stdout=read(GH200))
    imex.collect_imex(_tree(tmp_path, daemon=True, channels=(0,), config=True), run)
    assert run.calls[0] == ["nvidia-imex-ctl", "-N", "-c", str(tmp_path / "etc" / "nvidia-imex" / "config.cfg")]


def test_channel_names_other_than_channelN_are_ignored():
    assert imex.parse_channels(["channel2", "channel0", "README", "channelX", "channel10"]) == [0, 2, 10]
