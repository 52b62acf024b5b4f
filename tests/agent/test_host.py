"""Host facts, load, disks, engines and weights, each read from a fake machine under tmp_path."""

from __future__ import annotations

import contextlib
import errno
import os
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.discovery import engines as engine_discovery
from agent.discovery import host, weights
from agent.discovery.errors import DiscoveryError
from agent.discovery.sources import Sources
from agent.discovery.tools import ToolOutput

UBUNTU = """PRETTY_NAME="Ubuntu 22.04.4 LTS"
NAME="Ubuntu"
VERSION_ID="22.04"
VERSION="22.04.4 LTS (Jammy Jellyfish)"
VERSION_CODENAME=jammy
ID=ubuntu
ID_LIKE=debian
HOME_URL="https://www.ubuntu.com/"
"""

RHEL = """NAME="Red Hat Enterprise Linux"
VERSION="9.4 (Plow)"
ID="rhel"
ID_LIKE="fedora"
VERSION_ID="9.4"
PRETTY_NAME='Red Hat Enterprise Linux 9.4 (Plow)'
# a comment
"""

X86_CPU = """processor\t: {n}
vendor_id\t: GenuineIntel
cpu family\t: 6
model\t\t: 143
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu vme de pse tsc msr avx avx2 avx512f hypervisor sse4_2
bugs\t\t: spectre_v1

"""

GRACE_CPU = """processor\t: {n}
BogoMIPS\t: 2000.00
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics sve sve2 bf16 i8mm
CPU implementer\t: 0x41
CPU architecture: 8
CPU variant\t: 0x0
CPU part\t: 0xd4f
CPU revision\t: 0

"""

MEMINFO = """MemTotal:       263892720 kB
MemFree:        12345678 kB
MemAvailable:   200000000 kB
Buffers:          123456 kB
HugePages_Total:       0
"""

MOUNTINFO = r"""22 1 259:2 / / rw,relatime shared:1 - ext4 /dev/nvme0n1p2 rw,errors=remount-ro
23 22 0:21 / /proc rw,nosuid,nodev,noexec,relatime shared:12 - proc proc rw
24 22 0:22 / /sys rw,nosuid,nodev,noexec,relatime shared:2 - sysfs sysfs rw
25 24 0:23 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:3 - cgroup2 cgroup2 rw,nsdelegate
26 22 0:5 / /dev rw,nosuid,relatime shared:4 - devtmpfs udev rw,size=131917540k,mode=755
27 22 0:25 / /run rw,nosuid,nodev,noexec,relatime shared:5 - tmpfs tmpfs rw,size=26391916k,mode=755
30 22 259:1 / /boot/efi rw,relatime shared:7 - vfat /dev/nvme0n1p1 rw,fmask=0077
31 22 259:3 / /data rw,relatime shared:8 - xfs /dev/nvme1n1 rw,attr2,inode64,noquota
40 22 0:50 / /mnt/shared rw,relatime shared:20 - nfs4 10.0.0.5:/export/models rw,vers=4.1,rsize=1048576
41 22 0:51 / /lustre rw,relatime shared:21 - lustre 10.0.1.1@o2ib:/scratch rw,flock
42 22 7:1 / /snap/core20/2015 ro,nodev,relatime shared:22 - squashfs /dev/loop1 ro,errors=continue
50 31 259:3 /models /srv/models rw,relatime shared:8 - xfs /dev/nvme1n1 rw,attr2
51 22 259:3 / /mnt/data2 rw,relatime - xfs /dev/nvme1n1 rw,attr2
60 22 0:60 / /var/lib/docker/overlay2/abc/merged rw,relatime - overlay overlay rw,lowerdir=/a:/b
61 22 0:50 / /var/lib/kubelet/pods/u1/volumes/kubernetes.io~nfs/pv1 rw - nfs4 10.0.0.5:/export/models rw
62 22 259:4 / /mnt/my\040disk rw,relatime - ext4 /dev/sdb1 rw
63 22 0:70 / /mnt/ceph rw,relatime - ceph 10.0.0.9:6789:/ rw,name=admin
64 22 0:71 / /mnt/jfs rw,relatime - fuse.juicefs JuiceFS:myjfs rw,user_id=0
65 22 0:72 / /weka rw,relatime - wekafs default rw
66 22 0:73 / /run/models rw,relatime - tmpfs tmpfs rw
"""


# --- os-release, cpuinfo, meminfo --------------------------------------------------------------------------------


def test_os_release_quoting_both_ways():
    assert host.parse_os_release(UBUNTU)["PRETTY_NAME"] == "Ubuntu 22.04.4 LTS"
    rhel = host.parse_os_release(RHEL)
    assert (rhel["ID"], rhel["VERSION_ID"]) == ("rhel", "9.4")
    assert rhel["PRETTY_NAME"] == "Red Hat Enterprise Linux 9.4 (Plow)"
    assert host.parse_os_release('ID="unbalanced\n')["ID"] == "unbalanced"
    with pytest.raises(DiscoveryError):
        host.parse_os_release("garbage only\n")


def test_x86_cpuinfo_model_count_and_flags():
    info = host.parse_cpuinfo("".join(X86_CPU.format(n=n) for n in range(4)))
    assert info["cpus"] == 4
    assert info["cpu_model"] == "Intel(R) Xeon(R) Platinum 8480+"
    assert "avx2" in info["cpu_flags"] and "hypervisor" in info["cpu_flags"]
    assert info["cpu_flags"] == sorted(info["cpu_flags"])


def test_grace_cpuinfo_names_the_core_from_its_part_number():
    info = host.parse_cpuinfo("".join(GRACE_CPU.format(n=n) for n in range(72)))
    assert info["cpus"] == 72
    assert info["cpu_model"] == "ARM Neoverse-V2"
    assert "sve2" in info["cpu_flags"]


def test_unknown_arm_part_is_said_plainly():
    info = host.parse_cpuinfo("processor : 0\nCPU implementer : 0x61\nCPU part : 0x022\n")
    assert info["cpu_model"] == "implementer 0x61 part 0x022"


def test_meminfo():
    mem = host.parse_meminfo(MEMINFO)
    assert mem["MemTotal"] == 263892720
    assert mem["HugePages_Total"] == 0


@pytest.mark.parametrize(
    ("flags", "arch", "dmi", "hyp", "expected"),
    [
        (["avx2", "hypervisor"], "x86_64", "Amazon EC2 p5.48xlarge Amazon EC2", "", "amazon"),
        (["avx2"], "x86_64", "Amazon EC2 c5.metal Amazon EC2", "", "none"),
        (["avx2", "hypervisor"], "x86_64", "Microsoft Corporation Virtual Machine", "", "microsoft"),
        (["avx2", "hypervisor"], "x86_64", "QEMU Standard PC (Q35 + ICH9, 2009)", "", "qemu"),
        (["avx2", "hypervisor"], "x86_64", "", "", "vm"),
        (["avx2"], "x86_64", "Supermicro SYS-821GE-TNHR", "", "none"),
        (["sve"], "aarch64", "Amazon EC2 p6e-gb200.36xlarge", "", "amazon"),
        (["sve"], "aarch64", "NVIDIA Grace Hopper", "", None),
        (None, "x86_64", "", "", None),
        (["avx2"], "x86_64", "", "xen\n", "xen"),
    ],
)
def test_virtualization(flags, arch, dmi, hyp, expected):
    assert host.detect_virtualization(flags, arch, dmi, hyp) == expected


def _machine(tmp_path: Path, cpuinfo: str, os_release: str = UBUNTU, dmi: dict | None = None) -> Sources:
    proc, etc, sys = tmp_path / "proc", tmp_path / "etc", tmp_path / "sys"
    (proc / "sys" / "kernel").mkdir(parents=True)
    (proc / "sys" / "kernel" / "hostname").write_text("gpu-node-07\n")
    (proc / "sys" / "kernel" / "osrelease").write_text("6.8.0-1015-nvidia\n")
    (proc / "cpuinfo").write_text(cpuinfo)
    (proc / "meminfo").write_text(MEMINFO)
    etc.mkdir()
    (etc / "os-release").write_text(os_release)
    (sys / "class" / "dmi" / "id").mkdir(parents=True)
    for name, value in (dmi or {}).items():
        (sys / "class" / "dmi" / "id" / name).write_text(value + "\n")
    return Sources(proc_root=proc, etc_root=etc, sysfs_root=sys)


def _uname(machine: str):
    return lambda: os.uname_result(("Linux", "ignored", "ignored", "#1", machine))


def test_read_host_x86_vm(tmp_path):
    cpuinfo = "".join(X86_CPU.format(n=n) for n in range(2))
    sources = _machine(tmp_path, cpuinfo, dmi={"sys_vendor": "Amazon EC2", "product_name": "p5.48xlarge"})
    facts, problems = host.read_host(sources, uname=_uname("x86_64"))
    assert problems == []
    assert facts == {
        "hostname": "gpu-node-07",
        "kernel": "6.8.0-1015-nvidia",
        "arch": "x86_64",
        "os": "ubuntu",
        "os_version": "22.04",
        "os_name": "Ubuntu 22.04.4 LTS",
        "cpus": 2,
        "cpu_model": "Intel(R) Xeon(R) Platinum 8480+",
        "cpu_flags": ["avx", "avx2", "avx512f", "de", "fpu", "hypervisor", "msr", "pse", "sse4_2", "tsc", "vme"],
        "memory_mb": 263892720 // 1024,
        "virtualization": "amazon",
    }


def test_read_host_grace_bare_metal_has_no_virtualization_key(tmp_path):
    sources = _machine(tmp_path, GRACE_CPU.format(n=0), os_release=RHEL)
    facts, _ = host.read_host(sources, uname=_uname("aarch64"))
    assert facts["arch"] == "aarch64"
    assert facts["os"] == "rhel"
    assert "virtualization" not in facts  # Arm has no hypervisor flag: unknown, not "none"


def test_read_host_garbled_sources_leave_keys_out_and_say_why(tmp_path):
    sources = _machine(tmp_path, "\n\n", os_release="not an os-release\n")
    facts, problems = host.read_host(sources, uname=_uname("x86_64"))
    assert "os" not in facts and "cpus" not in facts and "cpu_model" not in facts
    assert facts["hostname"] == "gpu-node-07"
    assert len(problems) == 2


# --- load ------------------------------------------------------------------------------------------------------------


def test_load_sampler_first_call_has_no_cpu_percent_then_measures(tmp_path):
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "loadavg").write_text("3.52 2.10 1.05 4/1234 56789\n")
    (proc / "meminfo").write_text(MEMINFO)
    (proc / "stat").write_text("cpu  100 0 100 700 100 0 0 0 0 0\ncpu0 50 0 50 350 50 0 0 0 0 0\nintr 1\n")
    sampler = host.LoadSampler()
    first = sampler.sample(proc)
    assert "cpu_percent" not in first
    assert (first["load1"], first["load5"], first["load15"]) == (3.52, 2.10, 1.05)
    assert first["memory_total_mb"] == 263892720 // 1024
    assert first["memory_available_mb"] == 200000000 // 1024
    assert first["memory_used_mb"] == (263892720 - 200000000) // 1024
    # +300 user +100 system +500 idle +100 iowait; guest (50) is inside user already and must not count twice.
    (proc / "stat").write_text("cpu  400 0 200 1200 200 0 0 0 50 0\n")
    assert sampler.sample(proc)["cpu_percent"] == 40.0


def test_load_counters_going_backwards_give_no_percent():
    assert host.cpu_percent((500, 1000), (100, 200)) is None
    assert host.cpu_percent((500, 1000), (500, 1000)) is None
    assert host.cpu_percent(None, (1, 2)) is None


def test_memavailable_missing_leaves_used_and_available_out():
    assert host._memory({"MemTotal": 2048}) == {"memory_total_mb": 2}


# --- disks -----------------------------------------------------------------------------------------------------------


def test_mountinfo_fields_and_escapes():
    mounts = host.parse_mountinfo(MOUNTINFO)
    assert mounts[0] == {"mount": "/", "root": "/", "dev": "259:2", "fstype": "ext4", "device": "/dev/nvme0n1p2"}
    assert any(m["mount"] == "/mnt/my disk" for m in mounts)
    bind = next(m for m in mounts if m["mount"] == "/srv/models")
    assert bind["root"] == "/models"


def test_disks_skip_pseudo_and_container_mounts_and_tell_shared_apart():
    disks = host.select_disks(host.parse_mountinfo(MOUNTINFO))
    by_mount = {d["mount"]: d for d in disks}
    assert list(by_mount) == [
        "/",
        "/boot/efi",
        "/data",
        "/mnt/shared",
        "/lustre",
        "/srv/models",
        "/mnt/my disk",
        "/mnt/ceph",
        "/mnt/jfs",
        "/weka",
    ]
    shared = {m for m, d in by_mount.items() if d["shared"]}
    assert shared == {"/mnt/shared", "/lustre", "/mnt/ceph", "/mnt/jfs", "/weka"}
    assert by_mount["/mnt/shared"]["device"] == "10.0.0.5:/export/models"


def test_model_dirs_are_marked_on_the_disk_that_holds_them():
    model_dirs = ["/mnt/shared/hf", "/srv/models/llama", "/mnt/data2/x", "/run/models", "/home/me/models", "/lustrex"]
    disks = {d["mount"]: d for d in host.select_disks(host.parse_mountinfo(MOUNTINFO), model_dirs)}
    assert disks["/mnt/shared"]["model_dirs"] == ["/mnt/shared/hf"]
    assert disks["/srv/models"]["model_dirs"] == ["/srv/models/llama"]
    assert disks["/data"]["model_dirs"] == ["/mnt/data2/x"]  # the same filesystem mounted twice is one disk
    assert disks["/"]["model_dirs"] == ["/home/me/models", "/lustrex"]  # "/lustrex" is not under "/lustre"
    assert "model_dirs" not in disks["/lustre"]  # /run/models is on a tmpfs we skip, not credited elsewhere


def test_proc_mounts_fallback():
    mounts = host.parse_mounts("/dev/sda1 / ext4 rw 0 0\nproc /proc proc rw 0 0\nsrv:/m /m nfs rw 0 0\n")
    assert [d["mount"] for d in host.select_disks(mounts)] == ["/", "/m"]


def _statvfs(blocks=1000, bavail=250, frsize=4096):
    return lambda path: SimpleNamespace(f_blocks=blocks, f_bavail=bavail, f_frsize=frsize)


def _proc_with_mounts(tmp_path: Path, text: str = MOUNTINFO) -> Path:
    proc = tmp_path / "proc"
    (proc / "self").mkdir(parents=True)
    (proc / "self" / "mountinfo").write_text(text)
    return proc


def test_read_disks_sizes(tmp_path):
    sources = Sources(proc_root=_proc_with_mounts(tmp_path), model_dirs=(Path("/mnt/shared/hf"),))
    disks = host.read_disks(sources, statvfs=_statvfs())
    root = disks[0]
    assert (root["total_bytes"], root["free_bytes"]) == (4096000, 1024000)
    assert next(d for d in disks if d["mount"] == "/mnt/shared")["model_dirs"] == ["/mnt/shared/hf"]


def test_statvfs_refused_leaves_sizes_out(tmp_path):
    def refuse(path):
        raise PermissionError(errno.EACCES, "Permission denied")

    disks = host.read_disks(Sources(proc_root=_proc_with_mounts(tmp_path)), statvfs=refuse)
    assert all("total_bytes" not in d and d["error"] == "statvfs failed: Permission denied" for d in disks)


def test_a_hung_network_mount_costs_a_timeout_not_the_report(tmp_path):
    release = threading.Event()
    one = "22 1 0:50 / /mnt/dead rw - nfs4 10.9.9.9:/gone rw\n"
    sources = Sources(proc_root=_proc_with_mounts(tmp_path, one))

    def hang(path):
        release.wait(5)
        return _statvfs()(path)

    try:
        first = host.read_disks(sources, statvfs=hang, timeout=0.05)
        assert "did not answer within 0.05 s" in first[0]["error"]
        second = host.read_disks(sources, statvfs=hang, timeout=0.05)
        assert "still stuck" in second[0]["error"]  # no second thread piles up behind the first
    finally:
        release.set()
    for _ in range(100):
        if "/mnt/dead" not in host._hung:
            break
        threading.Event().wait(0.01)
    assert host.read_disks(sources, statvfs=_statvfs(), timeout=1)[0]["total_bytes"] == 4096000


def test_no_mount_table_is_a_discovery_error(tmp_path):
    (tmp_path / "proc").mkdir()
    with pytest.raises(DiscoveryError):
        host.read_disks(Sources(proc_root=tmp_path / "proc"), statvfs=_statvfs())


# --- engines ---------------------------------------------------------------------------------------------------------


def _versions(**found):
    return lambda dist: found.get(dist)


def test_engines_from_python_packages_without_running_anything():
    calls = []
    engines = engine_discovery.find_engines(
        run=lambda argv: calls.append(argv) or ToolOutput(error="unused"),
        version_of=_versions(vllm="0.6.3", llama_cpp_python="0.3.2", sglang="0.4.1.post3"),
        which=lambda exe: None,
    )
    assert engines == {"vllm": "0.6.3", "sglang": "0.4.1.post3", "llamacpp": "0.3.2"}
    assert calls == []


def test_no_engine_found_is_an_empty_dict():
    found = engine_discovery.find_engines(run=lambda argv: ToolOutput(), version_of=_versions(), which=lambda exe: None)
    assert found == {}


def test_vllm_in_another_venv_is_read_from_its_dist_info(tmp_path):
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "vllm").write_text("#!/venv/bin/python\n")
    (venv / "lib" / "python3.12" / "site-packages" / "vllm-0.6.3.post1.dist-info").mkdir(parents=True)
    calls = []
    engines = engine_discovery.find_engines(
        run=lambda argv: calls.append(argv) or ToolOutput(error="unused"),
        version_of=_versions(),
        which=lambda exe: str(venv / "bin" / "vllm") if exe == "vllm" else None,
    )
    assert engines == {"vllm": "0.6.3.post1"}
    assert calls == []


def test_executables_asked_for_their_version():
    outputs = {
        "vllm": ToolOutput(stdout="INFO 11-02 10:00:00 __init__.py:12] loading\n0.7.2\n", exit_code=0),
        "llama-server": ToolOutput(stdout="", exit_code=0),  # it prints its version on stderr
    }
    engines = engine_discovery.find_engines(
        run=lambda argv: outputs[argv[0]], version_of=_versions(), which=lambda exe: f"/usr/local/bin/{exe}"
    )
    assert engines == {"vllm": "0.7.2", "llamacpp": None}


def test_llama_server_version_line():
    text = "version: 4033 (a9e8a9a0)\nbuilt with cc (Ubuntu 11.4.0) for x86_64-linux-gnu\n"
    assert engine_discovery.parse_engine_version(text) == "b4033"
    assert engine_discovery.parse_engine_version("Traceback (most recent call last):\n  boom\n") is None


# --- weights ---------------------------------------------------------------------------------------------------------


def _file(path: Path, size: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\0" * size)
    return path


def _models(tmp_path: Path) -> Path:
    root = tmp_path / "models"
    _file(root / "llama-7b.Q4_K_M.gguf", 10)
    _file(root / "qwen" / "Qwen2.5-72B-Q4_K_M-00001-of-00002.gguf", 7)
    _file(root / "qwen" / "Qwen2.5-72B-Q4_K_M-00002-of-00002.gguf", 5)
    llama = root / "meta-llama" / "Llama-3-8B"
    _file(llama / "config.json", 3)
    _file(llama / "model-00001-of-00002.safetensors", 100)
    _file(llama / "model-00002-of-00002.safetensors", 50)
    _file(llama / "original" / "ignored.gguf", 1)  # inside a model directory: not a model of its own
    repo = root / "hub" / "models--meta-llama--Llama-3.1-8B"
    _file(repo / "blobs" / "aaa", 4)
    _file(repo / "blobs" / "bbb", 400)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("5f0b02c")
    snap = repo / "snapshots" / "5f0b02c"
    snap.mkdir(parents=True)
    (snap / "config.json").symlink_to("../../blobs/aaa")
    (snap / "model.safetensors").symlink_to("../../blobs/bbb")
    (snap / "copy.safetensors").symlink_to("../../blobs/bbb")  # same blob twice counts once
    _file(root / "hub" / "models--gpt2" / "snapshots" / "e7da" / "tokenizer.json", 2)  # no weights
    _file(root / ".git" / "lfs.gguf", 1)
    (root / "loop").symlink_to(root)
    return root


def test_weights_of_every_format(tmp_path):
    root = _models(tmp_path)
    found, problems = weights.scan_weights([root])
    assert problems == []
    assert [(e["format"], e["name"], e["bytes"]) for e in found] == [
        ("hf-cache", "meta-llama/Llama-3.1-8B", 404),
        ("gguf", "llama-7b.Q4_K_M", 10),
        ("safetensors", "meta-llama/Llama-3-8B", 150),
        ("gguf", "qwen/Qwen2.5-72B-Q4_K_M", 12),
    ]
    hf = found[0]
    assert hf["revision"] == "5f0b02c"
    assert hf["path"] == str(root / "hub" / "models--meta-llama--Llama-3.1-8B" / "snapshots" / "5f0b02c")
    assert found[3]["parts"] == 2 and "incomplete" not in found[3]


def test_missing_shard_and_missing_blob_are_incomplete(tmp_path):
    root = tmp_path / "m"
    _file(root / "big-00001-of-00003.gguf", 1)
    snap = root / "models--org--x" / "snapshots" / "r1"
    snap.mkdir(parents=True)
    (snap / "model.safetensors").symlink_to("../../blobs/not-yet")
    _file(root / "models--org--x" / "snapshots" / "r1" / "other.bin", 3)
    found, _ = weights.scan_weights([root])
    assert all(e.get("incomplete") for e in found)


def test_depth_bound(tmp_path):
    deep = tmp_path / "m" / "a" / "b" / "c"
    _file(deep / "deep.gguf", 1)
    assert weights.scan_weights([tmp_path / "m"], max_depth=2)[0] == []
    assert len(weights.scan_weights([tmp_path / "m"], max_depth=3)[0]) == 1


def test_time_bound_says_the_list_is_incomplete(tmp_path):
    root = _models(tmp_path)
    ticks = iter(range(0, 10_000, 4))
    _, problems = weights.scan_weights([root], budget_s=10, clock=lambda: next(ticks))
    assert problems and "stopped after 10 s" in problems[0]


def test_missing_model_dir_is_a_problem(tmp_path):
    found, problems = weights.scan_weights([tmp_path / "nope"])
    assert found == [] and "does not exist" in problems[0]


# --- mangled text ----------------------------------------------------------------------------------------------------

PARSERS = [
    host.parse_os_release,
    host.parse_cpuinfo,
    host.parse_meminfo,
    host.parse_mountinfo,
    host.parse_mounts,
    host.parse_cpu_times,
    host.parse_loadavg,
    engine_discovery.parse_engine_version,
]


@settings(max_examples=150, deadline=None)
@given(st.text())
def test_host_parsers_give_a_result_or_discovery_error(text):
    for parse in PARSERS:
        with contextlib.suppress(DiscoveryError):
            parse(text)


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_mangled_real_looking_inputs(data):
    source, parse = data.draw(
        st.sampled_from(
            [
                (MOUNTINFO, host.parse_mountinfo),
                (UBUNTU, host.parse_os_release),
                ("".join(X86_CPU.format(n=n) for n in range(2)), host.parse_cpuinfo),
                (GRACE_CPU.format(n=0), host.parse_cpuinfo),
            ]
        )
    )
    cut = data.draw(st.integers(0, len(source)))
    noise = data.draw(st.text(max_size=30))
    with contextlib.suppress(DiscoveryError):
        result = parse(source[:cut] + noise + source[cut + len(noise) :])
        if parse is host.parse_mountinfo:
            host.select_disks(result, ["/data/x"])
