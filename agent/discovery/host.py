"""The machine around the GPUs: host facts, load, disks, IMEX addresses (engines: engines.py; weights: weights.py).

Every parser here is pure (text in, data out) and raises only DiscoveryError;
every reader takes the roots from Sources so a test can fake the machine.
Throughout, a key that is absent means *unknown*: we never write a zero we
did not read.
"""

from __future__ import annotations

import ipaddress
import os
import re
import shlex
import threading
from collections.abc import Callable, Iterable
from pathlib import Path

from agent.discovery.errors import DiscoveryError
from agent.discovery.infiniband import parse_ip_addresses
from agent.discovery.sources import Sources
from agent.discovery.tools import ToolOutput, run_tool

Run = Callable[[list[str]], ToolOutput]


def _read(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return None


# === host facts ===================================================================================================


def parse_os_release(text: str) -> dict[str, str]:
    """``KEY=VALUE`` lines of os-release, shell quoting removed. Lines that are not assignments are skipped,
    as systemd does; DiscoveryError only when no assignment at all is found in non-empty text."""
    values: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, raw = line.split("=", 1)
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            continue
        try:
            words = shlex.split(raw)
        except ValueError:
            words = [raw.strip("\"'")]  # an unbalanced quote: keep what is there rather than lose the line
        values[key] = " ".join(words)
    if text.strip() and not values:
        raise DiscoveryError("os-release holds no KEY=VALUE line")
    return values


# CPU implementer and part numbers (as in the kernel's and lscpu's tables) for the Arm cores found in GPU servers:
# aarch64 kernels print no "model name", so this is how Grace says it is a Neoverse-V2.
_ARM_IMPLEMENTERS = {"0x41": "ARM", "0x4e": "NVIDIA", "0xc0": "Ampere", "0x48": "HiSilicon", "0x51": "Qualcomm"}
_ARM_PARTS = {
    ("0x41", "0xd0c"): "Neoverse-N1",
    ("0x41", "0xd40"): "Neoverse-V1",
    ("0x41", "0xd49"): "Neoverse-N2",
    ("0x41", "0xd4f"): "Neoverse-V2",
    ("0x41", "0xd84"): "Neoverse-V3",
    ("0x41", "0xd8e"): "Neoverse-N3",
    ("0x41", "0xd08"): "Cortex-A72",
    ("0x41", "0xd0b"): "Cortex-A76",
    ("0x4e", "0x004"): "Carmel",
    ("0xc0", "0xac3"): "Ampere-1",
    ("0xc0", "0xac4"): "Ampere-1a",
    ("0x48", "0xd01"): "TaiShan-v110",
}


def parse_cpuinfo(text: str) -> dict:
    """``cpu_model``, ``cpus`` and ``cpu_flags`` from /proc/cpuinfo (x86 ``flags`` or Arm ``Features``).

    Each key is left out when the text does not say it. DiscoveryError when no ``key : value`` line exists.
    """
    blocks: list[dict[str, str]] = [{}]
    for line in text.splitlines():
        if not line.strip():
            if blocks[-1]:
                blocks.append({})
            continue
        if ":" in line:
            key, value = line.split(":", 1)
            blocks[-1].setdefault(key.strip().lower(), value.strip())
    blocks = [b for b in blocks if b]
    if not blocks:
        raise DiscoveryError("cpuinfo has no 'key : value' line")
    processors = [b for b in blocks if b.get("processor", "").isdigit()]
    first = processors[0] if processors else blocks[0]
    info: dict = {}
    if processors:
        info["cpus"] = len(processors)
    model = _cpu_model(first)
    if model:
        info["cpu_model"] = model
    flags = first.get("flags") or first.get("features")
    if flags:
        info["cpu_flags"] = sorted(set(flags.split()))
    return info


def _cpu_model(block: dict[str, str]) -> str | None:
    if block.get("model name"):
        return block["model name"]
    if block.get("cpu"):  # ppc64le: "POWER9 (raw), altivec supported"
        return block["cpu"]
    implementer, part = block.get("cpu implementer", "").lower(), block.get("cpu part", "").lower()
    if not implementer:
        return None
    vendor = _ARM_IMPLEMENTERS.get(implementer, f"implementer {implementer}")
    core = _ARM_PARTS.get((implementer, part), f"part {part}" if part else None)
    return f"{vendor} {core}" if core else vendor


def parse_meminfo(text: str) -> dict[str, int]:
    """``/proc/meminfo`` in kB: ``{"MemTotal": 263892720, ...}``; lines that do not read are skipped."""
    values: dict[str, int] = {}
    for line in text.splitlines():
        match = re.match(r"^([\w()]+):\s+(\d+)(?:\s*kB)?\s*$", line)
        if match:
            values[match.group(1)] = int(match.group(2))
    return values


# systemd-detect-virt's names, so operators see the word they already know.
_DMI_VIRT = [
    ("amazon ec2", "amazon"),
    ("google", "google"),
    ("qemu", "qemu"),
    ("kvm", "kvm"),
    ("vmware", "vmware"),
    ("virtualbox", "oracle"),
    ("innotek", "oracle"),
    ("xen", "xen"),
    ("microsoft corporation", "microsoft"),
    ("parallels", "parallels"),
    ("openstack", "kvm"),
    ("bochs", "bochs"),
]


def detect_virtualization(flags: Iterable[str] | None, arch: str | None, dmi: str, hypervisor_type: str) -> str | None:
    """A systemd-detect-virt style name, ``"none"`` on x86 bare metal, or None when we cannot tell.

    x86 hypervisors all set the ``hypervisor`` CPU flag, so on x86 its absence is bare metal; Arm has no
    such flag, so there only DMI or /sys/hypervisor can say, and silence means unknown.
    An EC2 ``*.metal`` instance carries Amazon's DMI but no hypervisor.
    """
    dmi = dmi.lower()
    in_vm = flags is not None and "hypervisor" in flags
    if hypervisor_type.strip():
        return hypervisor_type.strip().lower()
    if ".metal" in dmi:
        return "none"
    for needle, name in _DMI_VIRT:
        if needle in dmi and (in_vm or needle != "microsoft corporation" or "virtual machine" in dmi):
            return name
    if in_vm:
        return "vm"
    if flags is not None and arch in ("x86_64", "i686", "i386"):
        return "none"
    return None


def read_host(sources: Sources, uname: Callable[[], os.uname_result] = os.uname) -> tuple[dict, list[str]]:
    """The ``host`` section and problem sentences; a source that cannot be read leaves its keys out.

    ``uname`` is consulted only for what /proc does not hold (the machine arch on older kernels).
    """
    proc, etc = sources.proc_root, sources.etc_root
    host: dict = {}
    problems: list[str] = []
    for key, rel in (("hostname", "sys/kernel/hostname"), ("kernel", "sys/kernel/osrelease")):
        value = (_read(proc / rel) or "").strip()
        if value:
            host[key] = value
    arch = (_read(proc / "sys" / "kernel" / "arch") or "").strip() or uname().machine
    host["arch"] = arch
    release_text = _read(etc / "os-release") or _read(etc.parent / "usr" / "lib" / "os-release")
    release: dict[str, str] = {}
    try:
        release = parse_os_release(release_text or "")
    except DiscoveryError as exc:
        problems.append(str(exc))
    if release:
        for key, field in (("os", "ID"), ("os_version", "VERSION_ID"), ("os_name", "PRETTY_NAME")):
            if release.get(field):
                host[key] = release[field]
    cpuinfo = _read(proc / "cpuinfo")
    cpu: dict = {}
    try:
        cpu = parse_cpuinfo(cpuinfo) if cpuinfo is not None else {}
    except DiscoveryError as exc:
        problems.append(str(exc))
    host.update(cpu)
    mem = parse_meminfo(_read(proc / "meminfo") or "")
    if "MemTotal" in mem:
        host["memory_mb"] = mem["MemTotal"] // 1024
    dmi = " ".join((_read(sources.sysfs_root / "class" / "dmi" / "id" / n) or "").strip() for n in _DMI_FILES)
    hypervisor_type = _read(sources.sysfs_root / "hypervisor" / "type") or ""
    virt = detect_virtualization(cpu.get("cpu_flags"), arch, dmi, hypervisor_type)
    if virt:
        host["virtualization"] = virt
    return host, problems


_DMI_FILES = ("sys_vendor", "product_name", "bios_vendor")


# === load =========================================================================================================


def parse_cpu_times(text: str) -> tuple[int, int]:
    """(busy, total) jiffies from the aggregate ``cpu`` line of /proc/stat.

    guest and guest_nice are already counted in user and nice, so they are left out of the total;
    idle and iowait are the time the CPUs were not busy.
    """
    for line in text.splitlines():
        fields = line.split()
        if fields and fields[0] == "cpu":
            if len(fields) < 5 or not all(f.isdigit() for f in fields[1:]):
                raise DiscoveryError(f"/proc/stat cpu line not understood: {line[:80]!r}")
            values = [int(f) for f in fields[1:9]]  # user nice system idle iowait irq softirq steal
            idle = values[3] + (values[4] if len(values) > 4 else 0)
            total = sum(values)
            return total - idle, total
    raise DiscoveryError("/proc/stat has no aggregate cpu line")


def parse_loadavg(text: str) -> tuple[float, float, float]:
    fields = text.split()
    try:
        return float(fields[0]), float(fields[1]), float(fields[2])
    except (IndexError, ValueError) as exc:
        raise DiscoveryError(f"/proc/loadavg not understood: {text[:60]!r}") from exc


class LoadSampler:
    """Keeps the previous /proc/stat sample so each call can say how busy the CPUs were since the last.

    The first call has nothing to compare with, so its result has no ``cpu_percent`` (unknown, not 0).
    """

    def __init__(self) -> None:
        self._previous: tuple[int, int] | None = None

    def sample(self, proc_root: Path) -> dict:
        """``load1/5/15``, ``memory_*_mb`` and, from the second call on, ``cpu_percent``; absent keys unknown."""
        load: dict = {}
        loadavg = _read(proc_root / "loadavg")
        if loadavg is not None:
            load["load1"], load["load5"], load["load15"] = parse_loadavg(loadavg)
        load.update(_memory(parse_meminfo(_read(proc_root / "meminfo") or "")))
        stat = _read(proc_root / "stat")
        if stat is not None:
            now = parse_cpu_times(stat)
            percent = cpu_percent(self._previous, now)
            if percent is not None:
                load["cpu_percent"] = percent
            self._previous = now
        return load


def cpu_percent(before: tuple[int, int] | None, after: tuple[int, int]) -> float | None:
    """Busy share between two samples; None without a previous sample or when the counters went backwards."""
    if before is None:
        return None
    busy, total = after[0] - before[0], after[1] - before[1]
    if total <= 0 or busy < 0:
        return None
    return round(100.0 * busy / total, 1)


def _memory(mem: dict[str, int]) -> dict:
    """Used is total minus available, the figure ``free`` prints; kernels before 3.14 lack MemAvailable."""
    out: dict = {}
    if "MemTotal" in mem:
        out["memory_total_mb"] = mem["MemTotal"] // 1024
    if "MemAvailable" in mem:
        out["memory_available_mb"] = mem["MemAvailable"] // 1024
        if "MemTotal" in mem:
            out["memory_used_mb"] = (mem["MemTotal"] - mem["MemAvailable"]) // 1024
    return out


# === disks ========================================================================================================

# Kernel and container plumbing, not storage anyone puts models on.
# fmt: off
PSEUDO_FS = frozenset([
    "proc", "sysfs", "cgroup", "cgroup2", "devtmpfs", "devpts", "tmpfs", "ramfs", "shm", "securityfs", "debugfs",
    "tracefs", "pstore", "bpf", "mqueue", "hugetlbfs", "configfs", "fusectl", "autofs", "binfmt_misc", "efivarfs",
    "rpc_pipefs", "nsfs", "squashfs", "selinuxfs", "nfsd", "devfs", "rootfs", "cpuset",
    "fuse.lxcfs", "fuse.gvfsd-fuse", "fuse.portal", "fuse.snapfuse", "overlay", "aufs", "fuse.fuse-overlayfs",
])
# Network and cluster filesystems: the same data is seen from many nodes, so a model there need not be copied.
SHARED_FS = frozenset([
    "nfs", "nfs4", "lustre", "gpfs", "ceph", "fuse.ceph", "fuse.ceph-fuse", "ceph-fuse", "beegfs", "cifs", "smb3",
    "smbfs", "glusterfs", "fuse.glusterfs", "wekafs", "fuse.wekafs", "fuse.juicefs", "juicefs", "fuse.s3fs",
    "fuse.gcsfuse", "fuse.goofys", "fuse.rclone", "fuse.sshfs", "fuse.blobfuse", "fuse.blobfuse2",
    "fuse.mountpoint-s3", "fuse.alluxio-fuse", "fuse.cvmfs2", "fuse.geesefs", "fuse.3fs", "orangefs", "pvfs2",
    "ocfs2", "gfs2", "panfs", "afs",
])
# fmt: on
# Mounts inside these trees belong to containers and pods: the same disks again, hundreds of times.
_CONTAINER_TREES = ("/var/lib/docker/", "/var/lib/containerd/", "/run/containerd/", "/var/lib/kubelet/pods/", "/snap/")
_SYSTEM_TREES = ("/proc/", "/sys/", "/dev/")
# A stuck network mount blocks statvfs in the kernel; we wait this long, then say so.
STATVFS_TIMEOUT_S = 2.0


def _unescape(text: str) -> str:
    """mountinfo writes space, tab, newline and backslash as \\040, \\011, \\012, \\134."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), text)


def parse_mountinfo(text: str) -> list[dict]:
    """``/proc/self/mountinfo`` → ``{"mount", "device", "fstype", "root", "dev"}`` each.

    DiscoveryError on a line the kernel would not write: we would be reading the wrong file.
    """
    mounts = []
    for line in text.splitlines():
        if not line.strip():
            continue
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 6 or len(tail) < 2 or not re.fullmatch(r"\d+:\d+", fields[2]):
            raise DiscoveryError(f"mountinfo line not understood: {line[:100]!r}")
        mounts.append(
            {
                "mount": _unescape(fields[4]),
                "root": _unescape(fields[3]),
                "dev": fields[2],
                "fstype": tail[0],
                "device": _unescape(tail[1]),
            }
        )
    return mounts


def parse_mounts(text: str) -> list[dict]:
    """``/proc/mounts`` (``device mount fstype options 0 0``), for kernels or sandboxes without mountinfo."""
    mounts = []
    for line in text.splitlines():
        fields = line.split()
        if not fields:
            continue
        if len(fields) < 3:
            raise DiscoveryError(f"mounts line not understood: {line[:100]!r}")
        mounts.append({"mount": _unescape(fields[1]), "device": _unescape(fields[0]), "fstype": fields[2]})
    return mounts


def is_storage(mount: dict) -> bool:
    """True for a mount that holds data: not pseudo, not a container's view of a disk we already list."""
    path, fstype = mount["mount"], mount["fstype"]
    if fstype in ("overlay", "aufs", "fuse.fuse-overlayfs") and path == "/":
        return True  # the agent's own container root: its free space is the host's image store
    if fstype in PSEUDO_FS:
        return False
    trees = _CONTAINER_TREES + _SYSTEM_TREES
    return not any((path + "/").startswith(tree) for tree in trees)


def is_shared(mount: dict) -> bool:
    fstype = mount["fstype"]
    # mountpoint-s3 and some other FUSE clients register a bare "fuse"; their source names them.
    return fstype in SHARED_FS or (fstype == "fuse" and mount["device"] in ("mountpoint-s3", "s3fs", "juicefs"))


def owning_mount(path: str, mounts: list[dict]) -> dict | None:
    """The mount a path lives on: the one with the longest mount point that contains it (last one wins a tie)."""
    best: dict | None = None
    for mount in mounts:
        point = mount["mount"].rstrip("/") + "/"
        if (path.rstrip("/") + "/").startswith(point) and (best is None or len(mount["mount"]) >= len(best["mount"])):
            best = mount
    return best


def _disk_key(mount: dict) -> tuple[str, str, str]:
    return (mount.get("dev", ""), mount.get("root", "/"), mount["device"])


def select_disks(mounts: list[dict], model_dirs: Iterable[str] = ()) -> list[dict]:
    """Storage mounts, each once, with ``shared`` and the configured model dirs that live on it."""
    by_key: dict[tuple[str, str, str], dict] = {}
    for mount in mounts:
        # The same filesystem mounted twice from the same root is one disk (the first mount point names it);
        # bind mounts of a subtree have another root and are kept.
        if is_storage(mount) and _disk_key(mount) not in by_key:
            by_key[_disk_key(mount)] = {
                "mount": mount["mount"],
                "device": mount["device"],
                "fstype": mount["fstype"],
                "shared": is_shared(mount),
            }
    for model_dir in model_dirs:
        # The owner is looked for among every mount, so a model dir on a skipped tmpfs is not credited to "/".
        owner = owning_mount(model_dir, mounts)
        disk = by_key.get(_disk_key(owner)) if owner is not None and is_storage(owner) else None
        if disk is not None:
            disk.setdefault("model_dirs", []).append(model_dir)
    return list(by_key.values())


_hung: set[str] = set()
_hung_lock = threading.Lock()


def bounded_statvfs(path: str, statvfs: Callable[[str], os.statvfs_result], timeout: float) -> os.statvfs_result:
    """statvfs in a daemon thread, so a dead NFS server costs us ``timeout`` seconds, not the agent.

    A path whose earlier call never returned is not asked again while that call is still stuck.
    Raises OSError (our own for a timeout) like statvfs itself.
    """
    with _hung_lock:
        if path in _hung:
            raise TimeoutError(f"statvfs on {path} is still stuck from an earlier report")
    box: dict = {}

    def call() -> None:
        try:
            box["result"] = statvfs(path)
        except OSError as exc:
            box["error"] = exc
        finally:
            with _hung_lock:
                _hung.discard(path)

    with _hung_lock:
        _hung.add(path)
    worker = threading.Thread(target=call, name=f"statvfs {path}", daemon=True)
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        raise TimeoutError(f"statvfs on {path} did not answer within {timeout:g} s (a hung network mount?)")
    if "error" in box:
        raise box["error"]
    return box["result"]


def read_disks(
    sources: Sources,
    statvfs: Callable[[str], os.statvfs_result] = os.statvfs,
    timeout: float = STATVFS_TIMEOUT_S,
) -> list[dict]:
    """The ``disks`` section. ``total_bytes``/``free_bytes`` (free to non-root users, as ``df`` shows) are left
    out with an ``error`` sentence when statvfs fails or hangs."""
    proc = sources.proc_root
    text = _read(proc / "self" / "mountinfo")
    if text is not None:
        mounts = parse_mountinfo(text)
    else:
        fallback = _read(proc / "mounts")
        if fallback is None:
            raise DiscoveryError(f"neither {proc}/self/mountinfo nor {proc}/mounts can be read")
        mounts = parse_mounts(fallback)
    model_dirs = [os.path.realpath(d) for d in sources.model_dirs]
    disks = select_disks(mounts, model_dirs)
    for disk in disks:
        try:
            st = bounded_statvfs(disk["mount"], statvfs, timeout)
        except OSError as exc:
            disk["error"] = str(exc) if isinstance(exc, TimeoutError) else f"statvfs failed: {exc.strerror or exc}"
            continue
        disk["total_bytes"] = st.f_blocks * st.f_frsize
        disk["free_bytes"] = st.f_bavail * st.f_frsize
    return disks


# === addresses (for IMEX) =========================================================================================


def local_ipv4_addresses(run: Run = run_tool) -> list[str]:
    """This machine's IPv4 addresses from ``ip -j -4 addr show``; [] when they cannot be read."""
    out = run(["ip", "-j", "-4", "addr", "show"])
    if out.error is not None or not out.stdout:
        return []
    try:
        return [a for a in parse_ip_addresses(out.stdout) if not ipaddress.ip_address(a).is_loopback]
    except (DiscoveryError, ValueError):
        return []
