"""``llmgw doctor`` on fake machines: IMEX channels, credentials and a real control plane, the CPU, disks,
the PCI bus, the table and the exit status."""

from __future__ import annotations

import httpx
import pytest

from agent import doctor_cmd
from agent.discovery.tools import ToolOutput
from agent.doctor import probe
from llmgw import cli
from tests.agent.doctor_tree import Tree, run_doctor, seen, verdict
from tests.captures import capture

GB200 = capture("nvidia-smi-q-x_gb200-x4_p6e-gb200_drv580.173.02_fabric-completed-healthy.xml")
NVL72_IMEX = capture("nvidia-imex-ctl-N_gb200-nvl72_p6e_18-nodes_up.txt")
HGX = capture("nvidia-smi-q-x_h100-80gb-hbm3-x8_hgx_drv580.105.08_fabric-zero-uuid.xml")


@pytest.fixture
def tree(tmp_path) -> Tree:
    return Tree(tmp_path / "machine")


@pytest.fixture
def no_tools(monkeypatch):
    """A machine where no NVIDIA tool is installed and dmesg is not ours to read."""
    monkeypatch.setattr(doctor_cmd, "RUN", lambda argv: ToolOutput(error=f"{argv[0]} not found"))


def test_the_imex_channel_is_read_from_dev(tree, capsys):
    _, without = run_doctor(tree, capsys, "--nvidia-smi-xml", str(GB200), "--imex-status", str(NVL72_IMEX))
    assert verdict(without, "imex channel") == "fail"
    tree.imex_channel(0)
    status, with_it = run_doctor(tree, capsys, "--nvidia-smi-xml", str(GB200), "--imex-status", str(NVL72_IMEX))
    assert verdict(with_it, "imex channel") == "ok" and status == 0


def test_a_host_without_avx2_warns(tmp_path, capsys):
    tree = Tree(tmp_path, flags="fpu sse sse2 avx hypervisor")
    status, rows = run_doctor(tree, capsys, "--nvidia-smi-xml", str(HGX))
    assert verdict(rows, "avx2") == "warn" and "no AVX2 on x86_64" in seen(rows, "avx2")
    assert '"host"' in rows["avx2"][0]["todo"]
    assert status == 0, "a warning alone does not fail the node"


def test_an_arm_host_has_no_avx2_to_miss(tmp_path, capsys):
    _, rows = run_doctor(Tree(tmp_path, arch="aarch64", flags="fp asimd"), capsys, "--nvidia-smi-xml", str(GB200))
    assert verdict(rows, "avx2") == "ok" and "aarch64" in seen(rows, "avx2")


def test_disk_room_under_the_model_dirs(tree, tmp_path, capsys):
    models = tmp_path / "models"
    models.mkdir()
    _, rows = run_doctor(tree, capsys, "--nvidia-smi-xml", str(HGX), "--model-dir", str(models))
    # The free space is the test machine's own (its / under the fake mount table), so only the words are checked.
    assert seen(rows, "disk room").startswith(f"{models}: ") and "free of" in seen(rows, "disk room")
    assert "on / (ext4)" in seen(rows, "disk room"), "the mount table given, not the machine's"
    status, rows = run_doctor(tree, capsys, "--nvidia-smi-xml", str(HGX), "--model-dir", str(tmp_path / "gone"))
    assert verdict(rows, "disk room") == "fail" and "does not exist" in seen(rows, "disk room") and status == 1


def test_model_dirs_come_from_the_agent_config(tree, tmp_path, capsys):
    models = tmp_path / "weights"
    models.mkdir()
    config = tmp_path / "agent.yaml"
    config.write_text(f"server: http://cp:8000\nmodel_dirs: [{models}]\n")
    _, rows = run_doctor(tree, capsys, "--nvidia-smi-xml", str(HGX), "--config", str(config))
    assert seen(rows, "disk room").startswith(f"{models}: ")


def test_a_bad_config_file_is_a_usage_error(tree, tmp_path, capsys):
    config = tmp_path / "agent.yaml"
    config.write_text("- not a mapping\n")
    assert doctor_cmd.main(tree.args("--config", str(config))) == 2
    assert "must hold a mapping" in capsys.readouterr().err


def test_nvidia_cards_on_the_bus_without_a_driver_fail(tree, capsys, no_tools):
    tree.pci_gpu("0000:17:00.0")
    tree.pci_gpu("0000:18:00.0", klass="0x068000")  # an NVSwitch is a bridge, not a GPU
    status, rows = run_doctor(tree, capsys)
    assert verdict(rows, "driver") == "fail" and status == 1
    assert "1 NVIDIA devices on the PCI bus" in seen(rows, "driver") and "nvidia-smi not found" in seen(rows, "driver")


def test_a_machine_without_nvidia_cards_is_a_cpu_node(tree, capsys, no_tools):
    status, rows = run_doctor(tree, capsys)
    assert verdict(rows, "driver") == "ok" and "a CPU node" in seen(rows, "driver")
    assert status == 0


# --- the control plane ----------------------------------------------------------------------------------------------


def test_not_registered_warns(tree, capsys):
    _, rows = run_doctor(tree, capsys, "--nvidia-smi-xml", str(HGX), offline=False)
    assert verdict(rows, "control plane") == "warn" and "not registered" in seen(rows, "control plane")


def test_an_unreachable_control_plane_fails_with_why(tree, capsys):
    tree.credential("http://127.0.0.1:9")  # the discard port: nothing listens
    status, rows = run_doctor(tree, capsys, "--nvidia-smi-xml", str(HGX), offline=False)
    assert verdict(rows, "control plane") == "fail" and status == 1
    assert "unreachable: ConnectError" in seen(rows, "control plane")


def test_the_heartbeat_sent_is_an_empty_one_with_the_credential(tree):
    tree.credential("http://cp:8000/", node="tray-07", secret="llmgw_node_abc")
    sent = {}

    def post(url, json, headers, timeout):
        sent.update(url=url, json=json, auth=headers["Authorization"])
        return httpx.Response(401, json={"error": "this node credential is unknown or was revoked"})

    reach = probe.reach_control_plane(tree.state, post=post)
    assert sent == {"url": "http://cp:8000/api/v1/agent/heartbeat", "json": {}, "auth": "Bearer llmgw_node_abc"}
    assert (reach.status, reach.node, reach.error) == (401, "tray-07", "this node credential is unknown or was revoked")


@pytest.mark.django_db(transaction=True)
def test_a_live_control_plane_accepts_then_refuses_a_revoked_credential(tree, capsys):
    from core.credentials import hash_token
    from inventory.models import Node
    from inventory.writes.heartbeats import desk
    from tests.asgiserver import asgi_live_server

    node = Node.objects.create(name="tray-01", credential_digest=hash_token("llmgw_node_secret"))
    with asgi_live_server() as url:
        tree.credential(url, node="tray-01", secret="llmgw_node_secret")
        status, rows = run_doctor(tree, capsys, "--nvidia-smi-xml", str(HGX), offline=False)
        assert verdict(rows, "control plane") == "ok" and "heartbeat accepted" in seen(rows, "control plane")
        desk.flush()  # what the flusher does each second (tests flush by hand)
        node.refresh_from_db()
        assert node.last_seen is not None, "the heartbeat reached the inventory"

        # Revoked: the desk knows the credential until its next flush finds it rotated (or 300 s pass),
        # the bound docs/architecture.md states; from then on the node is told to register again.
        Node.objects.filter(pk=node.pk).update(credential_digest="")
        run_doctor(tree, capsys, "--nvidia-smi-xml", str(HGX), offline=False)
        desk.flush()
        status, rows = run_doctor(tree, capsys, "--nvidia-smi-xml", str(HGX), offline=False)
        assert verdict(rows, "control plane") == "fail" and status == 1
        assert "credential revoked: register again" in seen(rows, "control plane")


# --- output ---------------------------------------------------------------------------------------------------------


def test_the_table_for_people_and_the_exit_status(tree, capsys):
    lost = capture("MOCK_nvidia-smi-q-x_gb200-profile_gpu1-lost.xml")
    assert doctor_cmd.main(tree.args("--nvidia-smi-xml", str(lost))) == 1
    out = capsys.readouterr().out
    for words in ("check", "status", "what to do", "GPU is lost", "reboot the node"):
        assert words in out
    assert "failed" in out and "can be trusted" not in out
    assert doctor_cmd.main(tree.args("--nvidia-smi-xml", str(HGX))) == 0
    assert "0 failed" in capsys.readouterr().out


def test_dispatch_through_llmgw_cli(tree, capsys):
    assert cli.main(["doctor", *tree.args("--json", "--nvidia-smi-xml", str(HGX))]) == 0
    assert '"checks"' in capsys.readouterr().out
