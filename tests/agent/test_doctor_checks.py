"""Each doctor check on hand-made reports: the cases no capture shows."""

from __future__ import annotations

import copy

import pytest

from agent.doctor import checks as C
from agent.doctor.checks import FAIL, OK, WARN, Facts, Reach

DOMAIN = "5c7e1f9a-8d1b-4e5e-9d52-2b1c3a4d5e6f"


def card(index: int, *, state="Completed", status="Success", uuid=DOMAIN, clique=7, degraded=False, **extra) -> dict:
    fabric = {"state": state, "status": status, "cluster_uuid": uuid, "clique_id": clique, "problems": []}
    fabric["bandwidth"] = "Degraded" if degraded else "Full"
    fabric["degraded"] = degraded
    if degraded:
        fabric["problems"] = ["fabric bandwidth degraded"]
    return {"index": index, "label": str(index), "health": [], "fabric": fabric, "mig_mode": "disabled", **extra}


def report(*cards, **extra) -> dict:
    return {"gpu_source": "nvml", "driver_version": "580.1", "gpus": list(cards), "problems": [], **extra}


def rows(found) -> dict[str, str]:
    return {c.check: c.status for c in found}


# --- fabric and domain ----------------------------------------------------------------------------------------------


def test_degraded_bandwidth_is_joined_but_amber():
    found = C.check_fabric(report(card(0), card(1, degraded=True)))
    assert [(c.status, c.seen) for c in found] == [
        (WARN, f"gpu 1: joined {DOMAIN}/7, bandwidth degraded"),
        (OK, f"gpu 0: joined {DOMAIN}/7, bandwidth full"),
    ]
    assert C.check_domain(report(card(0), card(1, degraded=True))).status == OK


def test_a_card_still_registering_fails_and_keeps_the_node_out_of_its_domain():
    r = report(card(0), card(1, state="In Progress", status=None, uuid=None))
    assert C.check_fabric(r)[0].status == FAIL and "registration in progress" in C.check_fabric(r)[0].seen
    domain = C.check_domain(r)
    assert domain.status == FAIL and domain.seen.startswith(f"gpu 1 not in {DOMAIN}/7")
    assert "nvidia-fabricmanager" in domain.todo


def test_cards_in_two_domains_fail():
    found = C.check_domain(report(card(0), card(1, clique=8)))
    assert found.status == FAIL and "cards in 2 domains" in found.seen and "partition" in found.todo


def test_a_zero_uuid_is_no_domain_and_not_a_failure():
    r = report(card(0, uuid="00000000-0000-0000-0000-000000000000", clique=0))
    assert C.check_fabric(r)[0].status == OK and "single NVSwitch" in C.check_fabric(r)[0].seen
    assert C.check_domain(r).status == OK and C.check_imex_channel(r).status == OK


# --- IMEX and the channel -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("imex", "expected"),
    [
        ({"state": "up", "domain_state": "UP", "node_status": "READY", "channels": [0]}, OK),
        ({"state": "down", "problems": ["IMEX domain state is DOWN, not UP"], "channels": [0]}, FAIL),
        ({"state": "not running", "problems": ["IMEX is installed but nvidia-imex is not running"]}, FAIL),
        ({"state": "unknown", "problems": ["nvidia-imex runs but its status is unknown"]}, WARN),
        ({"state": "not installed", "channels": []}, FAIL),
    ],
)
def test_imex_on_a_node_of_a_domain(imex, expected):
    found = C.check_imex(report(card(0), imex=imex))
    assert found.status == expected
    if expected != OK:
        assert found.todo


def test_imex_outside_a_domain_is_not_needed_but_a_stopped_daemon_is_worth_a_look():
    hgx = card(0, uuid="00000000-0000-0000-0000-000000000000", clique=0)
    assert C.check_imex(report(hgx, imex={"state": "not installed"})).status == OK
    assert C.check_imex(report(hgx, imex={"state": "not running"})).status == WARN
    assert C.check_imex(report(hgx)).status == WARN  # not looked at: unknown


@pytest.mark.parametrize(("channels", "expected"), [([0], OK), ([1], WARN), ([], FAIL), (None, WARN)])
def test_the_imex_channel(channels, expected):
    imex = {"state": "up"}
    if channels is not None:
        imex["channels"] = channels
    assert C.check_imex_channel(report(card(0), imex=imex)).status == expected


# --- MIG ------------------------------------------------------------------------------------------------------------


def test_mig_on_with_nothing_carved_warns():
    empty = card(0, mig_mode="enabled", health=[C.MIG_EMPTY], fabric=None)
    found = C.check_mig(report(empty))
    assert [c.status for c in found] == [WARN] and "nothing can run" in found[0].seen
    assert "-cgi" in found[0].todo
    # ...and it is a MIG matter, not a broken card.
    assert C.check_health(report(empty))[0].status == OK


def test_mig_pending_a_reset_warns():
    found = C.check_mig(report(card(0, mig_mode="disabled (pending enable)")))
    assert found[0].status == WARN and "waits for a GPU reset" in found[0].seen
    assert "nvidia-smi -r -i 0" in found[0].todo


def test_mig_instances_with_their_uuids_are_ok():
    inst = [
        {
            "index": 1000 + d,
            "label": f"0/mig{d}",
            "parent": 0,
            "mig_profile": "3g.40gb",
            "mig_uuid": f"MIG-{d}",
            "mig_mode": "enabled",
            "health": [],
        }
        for d in (1, 2)
    ]
    found = C.check_mig(report(*inst))
    assert [(c.status, c.seen) for c in found] == [(OK, "gpu 0: MIG on, 2 instances (2× 3g.40gb)")]
    broken = copy.deepcopy(inst)
    broken[0]["health"] = ["3 uncorrectable ECC errors in this instance since the last reset"]
    assert C.check_health(report(*broken))[0].seen.startswith("gpu 0/mig1: 3 uncorrectable")


# --- driver ---------------------------------------------------------------------------------------------------------


def test_no_gpu_is_a_cpu_node_unless_the_pci_bus_shows_nvidia_cards():
    none = {"gpu_source": "none", "gpus": [], "problems": ["NVML: Driver Not Loaded", "nvidia-smi not found"]}
    assert C.check_driver(none, Facts(nvidia_pci_devices=0)).status == OK
    failed = C.check_driver(none, Facts(nvidia_pci_devices=8))
    assert failed.status == FAIL and "8 NVIDIA devices" in failed.seen and "Driver Not Loaded" in failed.seen
    assert C.check_driver(none, Facts(nvidia_pci_devices=None)).status == WARN


def test_nvidia_smi_instead_of_nvml_warns_only_when_nvml_was_wanted():
    r = report(card(0), gpu_source="nvidia-smi", problems=["NVML: Library Not Found"])
    assert C.check_driver(r, Facts(use_nvml=True)).status == WARN
    assert "Library Not Found" in C.check_driver(r, Facts(use_nvml=True)).seen
    assert C.check_driver(r, Facts(use_nvml=False)).status == OK
    assert C.check_driver(report(card(0)), Facts()).seen == "driver 580.1, NVML loaded"


# --- host -----------------------------------------------------------------------------------------------------------


def test_avx2():
    assert C.check_avx2({"host": {"arch": "x86_64", "cpu_flags": ["avx", "avx2"]}}).status == OK
    vm = C.check_avx2({"host": {"arch": "x86_64", "cpu_flags": ["avx"], "virtualization": "kvm"}})
    assert vm.status == WARN and "kvm" in vm.seen and '"host"' in vm.todo
    assert C.check_avx2({"host": {"arch": "aarch64", "cpu_flags": ["asimd"]}}).status == OK
    assert C.check_avx2({"host": {"arch": "x86_64"}}).status == WARN
    assert C.check_avx2({}).status == WARN


@pytest.mark.parametrize(("free_gib", "expected"), [(1000, OK), (150, WARN), (5, FAIL)])
def test_disk_room_under_a_model_dir(free_gib, expected):
    disk = {
        "mount": "/models",
        "device": "/dev/nvme1n1",
        "fstype": "xfs",
        "shared": False,
        "model_dirs": ["/models"],
        "total_bytes": 2000 * C.GIB,
        "free_bytes": free_gib * C.GIB,
    }
    found = C.check_disks({"disks": [disk]}, Facts(model_dirs=("/models",)))
    assert [c.status for c in found] == [expected]
    assert found[0].seen == f"/models: {free_gib:.1f} GiB free of 2.0 TiB on /models (xfs)"


def test_disk_room_when_it_cannot_be_told():
    assert C.check_disks({"disks": []}, Facts())[0].status == WARN  # no model dir configured
    gone = C.check_disks({"disks": []}, Facts(model_dirs=("/m",), missing_model_dirs=("/m",)))
    assert gone[0].status == FAIL and "does not exist" in gone[0].seen
    hung = {"mount": "/nfs", "fstype": "nfs4", "model_dirs": ["/m"], "error": "statvfs on /nfs did not answer"}
    assert C.check_disks({"disks": [hung]}, Facts(model_dirs=("/m",)))[0].status == FAIL
    assert C.check_disks({}, Facts(model_dirs=("/m",)))[0].status == WARN


# --- the control plane ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reach", "expected", "words"),
    [
        (Reach("/s/credential.json", False), WARN, "not registered"),
        (Reach("/s/c.json", True, "http://cp", "n1", 200), OK, "heartbeat accepted"),
        (Reach("/s/c.json", True, "http://cp", "n1", 401, "unknown"), FAIL, "credential revoked: register again"),
        (Reach("/s/c.json", True, "http://cp", "n1", None, "ConnectError: refused"), FAIL, "unreachable: ConnectError"),
        (Reach("/s/c.json", True, "http://cp", "n1", 503), FAIL, "answered 503"),
        (None, OK, "not tried"),
    ],
)
def test_the_control_plane_row(reach, expected, words):
    found = C.check_control_plane(reach)
    assert found.status == expected and words in found.seen


def test_the_worst_row_decides():
    assert C.worst([]) == OK
    assert C.worst([C.Check("a", OK, ""), C.Check("b", WARN, "")]) == WARN
    assert C.worst([C.Check("a", FAIL, ""), C.Check("b", WARN, "")]) == FAIL
