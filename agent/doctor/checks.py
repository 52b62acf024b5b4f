"""The doctor's verdicts: a discovery report and a few extra facts in, one row per check out.

Pure: no I/O, so every verdict can be tested on captures and hand-made
reports. Each row says what was seen and, when it is not ``ok``, what a person
should do about it. ``fail`` means "do not trust this node for work until
fixed" and makes ``llmgw doctor`` exit non-zero; ``warn`` means "works, but
look"; ``ok`` includes "does not apply here" (an HGX's own NVSwitch is no
multi-node domain, and that is fine).

The verdicts follow the control plane's rules (DESIGN.md): a card with any
health problem is not placed, so it fails here too; a node is in an NVLink
domain only when every card has joined it; IMEX must be up, with a channel,
for a multi-node replica.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

from agent.discovery import fabric_facts

OK, WARN, FAIL = "ok", "warn", "fail"
_RANK = {OK: 0, WARN: 1, FAIL: 2}

IMEX_CHANNELS_DIR = "/dev/nvidia-caps-imex-channels"
GIB = 1024**3
# A 70B model in bf16 is about 140 GB of weights: below this a node cannot take one more of them.
WARN_FREE_BYTES = 200 * GIB
# Below this not even a small quantized model fits, and a full disk stops the engines' caches too.
FAIL_FREE_BYTES = 20 * GIB
# The health sentence discovery writes for a MIG card with nothing carved: a MIG matter, not a broken card.
MIG_EMPTY = "MIG enabled but no instances created"
X86 = ("x86_64", "amd64", "i386", "i686")


@dataclass(frozen=True)
class Check:
    """One row of the doctor's table. ``todo`` is empty when there is nothing to do."""

    check: str
    status: str
    seen: str
    todo: str = ""

    def as_json(self) -> dict[str, str]:
        return asdict(self)


@dataclass(frozen=True)
class Reach:
    """What happened when doctor called the control plane with this node's credential.

    ``registered`` False: no credential file (``server``/``node`` None).
    ``status`` None: no HTTP answer, and ``error`` says why. Otherwise
    ``status`` is the answer's and ``error`` the refusal's message, if any.
    """

    credential_file: str
    registered: bool
    server: str | None = None
    node: str | None = None
    status: int | None = None
    error: str | None = None


@dataclass(frozen=True)
class Facts:
    """What doctor knows besides the discovery report.

    ``nvidia_pci_devices`` None: the PCI bus was not looked at (captures).
    ``model_dirs`` are the configured model directories as real paths;
    ``missing_model_dirs`` those that do not exist. ``reach`` None: the
    control plane was not tried.
    """

    use_nvml: bool = True
    nvidia_pci_devices: int | None = None
    model_dirs: tuple[str, ...] = ()
    missing_model_dirs: tuple[str, ...] = ()
    reach: Reach | None = None


def worst(checks: Iterable[Check]) -> str:
    return max((c.status for c in checks), key=_RANK.__getitem__, default=OK)


def run_checks(report: dict[str, Any], facts: Facts) -> list[Check]:
    """Every check, in the order a person would run them by hand."""
    return [
        check_driver(report, facts),
        *check_health(report),
        *check_fabric(report),
        check_domain(report),
        check_imex(report),
        check_imex_channel(report),
        *check_mig(report),
        check_avx2(report),
        *check_disks(report, facts),
        check_control_plane(facts.reach),
    ]


# --- helpers --------------------------------------------------------------------------------------------------------


def _cards(report: dict[str, Any]) -> list[dict[str, Any]]:
    """Whole cards: entries that are not MIG instances."""
    return [g for g in report.get("gpus") or [] if "parent" not in g]


def _label(entry: dict[str, Any]) -> str:
    return str(entry.get("label", entry.get("index")))


def _span(labels: list[str]) -> str:
    """``gpu 0`` or ``gpus 0, 1, 3``."""
    return f"gpu {labels[0]}" if len(labels) == 1 else "gpus " + ", ".join(labels)


def _grouped(name: str, verdicts: list[tuple[str, tuple[str, str, str]]]) -> list[Check]:
    """One row per distinct verdict, naming the cards that share it, worst first."""
    by_verdict: dict[tuple[str, str, str], list[str]] = {}
    for label, verdict in verdicts:
        by_verdict.setdefault(verdict, []).append(label)
    rows = [Check(name, st, f"{_span(labels)}: {seen}", todo) for (st, seen, todo), labels in by_verdict.items()]
    return sorted(rows, key=lambda c: -_RANK[c.status])


def joined_domain(fabric: dict[str, Any] | None) -> str | None:
    """``<ClusterUUID>/<CliqueId>`` of the domain a card has joined, or None: the one rule (agent.nvlink_rules)."""
    key = fabric_facts.joined_domain(fabric)
    return None if key is None else key.text


def _size(n: int) -> str:
    for unit, scale in (("TiB", 1024**4), ("GiB", GIB)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n / 1024**2:.0f} MiB"


# --- driver and NVML ------------------------------------------------------------------------------------------------


def check_driver(report: dict[str, Any], facts: Facts) -> Check:
    """The driver answers (NVML loads, or nvidia-smi reads), or why not."""
    source, gpus, problems = report.get("gpu_source"), report.get("gpus") or [], report.get("problems") or []
    driver = report.get("driver_version")
    unreadable = [p for p in problems if p.startswith("cannot read ")]
    if unreadable and not gpus:
        return Check("driver", FAIL, unreadable[0], "give a complete nvidia-smi -q -x (or -q) capture")
    if source == "none" or not gpus:
        return _no_gpus(problems, facts)
    seen = f"driver {driver}" if driver else "driver version not reported"
    if report.get("cuda_version"):
        seen += f", CUDA {report['cuda_version']}"
    attached = [p for p in problems if p.startswith("nvidia-smi says")]
    if source == "capture":
        seen += " (from a capture)"
    elif source == "nvml":
        seen += ", NVML loaded"
    elif facts.use_nvml:
        why = next((p for p in problems if p.startswith("NVML:")), "NVML: did not load")
        return Check(
            "driver",
            WARN,
            f"{seen}, read through nvidia-smi; {why}",
            "the agent works through nvidia-smi, more slowly; install the NVML library matching the driver "
            "(libnvidia-ml.so.1, from the driver package)",
        )
    else:
        seen += ", read through nvidia-smi (NVML not tried)"
    if attached:
        return Check("driver", WARN, f"{seen}; {attached[0]}", "has a card fallen off the bus? lspci | grep -i nvidia")
    return Check("driver", OK, seen)


def _no_gpus(problems: list[str], facts: Facts) -> Check:
    why = "; ".join(p for p in problems if p.startswith(("NVML:", "nvidia-smi"))) or "no GPU reported"
    if facts.nvidia_pci_devices:
        return Check(
            "driver",
            FAIL,
            f"{facts.nvidia_pci_devices} NVIDIA devices on the PCI bus, but the driver does not answer: {why}",
            "install or load the NVIDIA driver (lsmod | grep nvidia; dmesg | grep NVRM), then run doctor again",
        )
    if facts.nvidia_pci_devices == 0:
        return Check("driver", OK, "no NVIDIA GPU on the PCI bus: a CPU node")
    return Check("driver", WARN, f"no GPU found: {why}", "if this node has GPUs, install the NVIDIA driver")


# --- card health ----------------------------------------------------------------------------------------------------


def _health_advice(problem: str) -> str:
    text = problem.lower()
    if "lost" in text:
        return "reboot the node; if the card stays lost, it needs service (reseat or RMA)"
    if "xid" in text:
        return "look the Xid up in NVIDIA's Xid catalogue; reset the GPU or reboot, and drain the node if it recurs"
    if "pending" in text:
        return "reset the GPU when idle (nvidia-smi -r -i N) or reboot; run doctor again"
    return "drain the node and have the card serviced; until then it takes no work"


def check_health(report: dict[str, Any]) -> list[Check]:
    """Every card (and MIG instance) healthy: not lost, no ECC, retired-page or remapping trouble, no Xid."""
    cards = _cards(report)
    instances = [g for g in report.get("gpus") or [] if "parent" in g]
    verdicts = []
    for entry in cards + instances:
        for problem in entry.get("health") or []:
            if problem != MIG_EMPTY:
                verdicts.append((_label(entry), (FAIL, problem, _health_advice(problem))))
    listing_only = [p for p in report.get("problems") or [] if p.startswith("only nvidia-smi -L was readable")]
    if not verdicts and listing_only:
        return [Check("gpu health", WARN, listing_only[0], "give nvidia-smi -q -x too: -L says nothing of health")]
    if not verdicts:
        seen = f"{len(cards)} card{'s' if len(cards) != 1 else ''} healthy" if cards else "no GPU"
        if instances:
            seen = f"{len(instances)} MIG instances healthy"
        return [Check("gpu health", OK, seen)]
    return _grouped("gpu health", verdicts)


# --- NVLink fabric --------------------------------------------------------------------------------------------------

_FABRIC_TODO = (
    "check nvidia-fabricmanager (systemctl status nvidia-fabricmanager; its log) and the NVLink switch trays; "
    "then reset the GPUs or reboot the node"
)


def fabric_verdict(fabric: dict[str, Any] | None) -> tuple[str, str, str]:
    """(status, seen, todo) for one card's fabric registration, as the report gives it."""
    if fabric is None:
        return OK, "no fabric reported (an older driver or a card that has none)", ""
    state = fabric.get("state") or "?"
    if state == "Not Supported":
        return OK, "no NVLink fabric (not supported by this card)", ""
    if state != "Completed":
        return FAIL, f"fabric registration {state.lower()}", _FABRIC_TODO
    status = fabric.get("status") or "not reported"
    if status.lower() != "success":
        return FAIL, f"fabric registration failed: {status}", _FABRIC_TODO
    domain = joined_domain(fabric)
    others = [p for p in fabric.get("problems") or [] if p != "fabric bandwidth degraded"]
    if domain is None:
        if others:
            return FAIL, "; ".join(others), _FABRIC_TODO
        return OK, "no multi-node domain (single NVSwitch)", ""
    if others:
        return FAIL, f"joined {domain}, but {'; '.join(others)}", _FABRIC_TODO
    if fabric.get("degraded"):
        return (
            WARN,
            f"joined {domain}, bandwidth degraded",
            "an NVLink is down or retrained slower: check the tray's cables and the switch trays; "
            "the card still works, more slowly across nodes",
        )
    return OK, f"joined {domain}, bandwidth {str(fabric.get('bandwidth') or 'not reported').lower()}", ""


def check_fabric(report: dict[str, Any]) -> list[Check]:
    """Every card's fabric joined (state Completed, status Success) and its bandwidth not degraded."""
    cards = [c for c in _cards(report) if not any("lost" in h.lower() for h in c.get("health") or [])]
    if not cards:
        return [Check("nvlink fabric", OK, "no card to look at (MIG instances and lost cards are judged elsewhere)")]
    return _grouped("nvlink fabric", [(_label(c), fabric_verdict(c.get("fabric"))) for c in cards])


def check_domain(report: dict[str, Any]) -> Check:
    """The cards of one node in one multi-node NVLink domain, every one of them, or in none."""
    fabrics = {_label(c): c.get("fabric") for c in _cards(report)}
    joined = {label: joined_domain(fabric) for label, fabric in fabrics.items()}
    domains = sorted({d for d in joined.values() if d})
    if not domains:
        return Check("nvlink domain", OK, "in no multi-node NVLink domain")
    if len(domains) > 1:
        spread = "; ".join(f"{_span([lbl for lbl, d in joined.items() if d == dom])} in {dom}" for dom in domains)
        return Check(
            "nvlink domain",
            FAIL,
            f"cards in {len(domains)} domains: {spread}",
            "the tray sits in two NVLink partitions: check the fabric manager's partition configuration",
        )
    # A card without NVLink at all (Not Supported) cannot join; any other card that has not keeps the node out.
    out = [lbl for lbl, d in joined.items() if d is None and (fabrics[lbl] or {}).get("state") != "Not Supported"]
    if not out:
        return Check("nvlink domain", OK, f"all {len(fabrics)} cards in {domains[0]}")
    unknown = all(fabrics[lbl] is None for lbl in out)
    return Check(
        "nvlink domain",
        FAIL,
        f"{_span(out)} not in {domains[0]}: the node is out of the domain until every card has joined",
        "see gpu health: a card that reports no fabric (lost?) keeps the node out" if unknown else _FABRIC_TODO,
    )


# --- IMEX -----------------------------------------------------------------------------------------------------------

_IMEX_TODO = (
    "systemctl status nvidia-imex; check that /etc/nvidia-imex/nodes_config.cfg lists every node of the domain "
    "and that they reach each other; nvidia-imex-ctl -N shows the domain"
)


def _in_domain(report: dict[str, Any]) -> str | None:
    return next((d for d in (joined_domain(c.get("fabric")) for c in _cards(report)) if d), None)


def check_imex(report: dict[str, Any]) -> Check:
    """``nvidia-imex`` running and this node up in its domain, where a multi-node domain needs it."""
    imex, domain = report.get("imex"), _in_domain(report)
    if imex is None:
        why = "; ".join(p for p in report.get("problems") or [] if p.startswith("IMEX:")) or "not looked at"
        return Check("imex", WARN, f"IMEX state unknown: {why}", "run doctor as root, or look with nvidia-imex-ctl -N")
    state, problems = imex.get("state"), "; ".join(imex.get("problems") or [])
    if state == "up":
        return Check(
            "imex",
            OK,
            f"nvidia-imex running, domain {imex.get('domain_state', 'UP')}, "
            f"this node {imex.get('node_status', 'READY')}",
        )
    if state == "not installed":
        if domain:
            return Check(
                "imex",
                FAIL,
                f"cards joined {domain} but IMEX is not installed: GPUs cannot share memory across nodes",
                "install nvidia-imex (the driver's nvidia-imex package) and list the domain's nodes in "
                "/etc/nvidia-imex/nodes_config.cfg",
            )
        return Check("imex", OK, "not installed (not needed outside a multi-node NVLink domain)")
    seen = f"IMEX {state}" + (f": {problems}" if problems else "")
    if state == "unknown":
        return Check("imex", WARN, seen, _IMEX_TODO)
    if state == "not running" and not domain:
        return Check("imex", WARN, seen + " (no card has joined a multi-node domain)", _IMEX_TODO)
    return Check("imex", FAIL, seen, _IMEX_TODO)


def check_imex_channel(report: dict[str, Any]) -> Check:
    """An IMEX channel (``channel0``) where IMEX is wanted: without one CUDA's fabric memory calls are refused."""
    imex = report.get("imex") or {}
    wanted = _in_domain(report) is not None or imex.get("state") not in (None, "not installed")
    channels = imex.get("channels")
    if not wanted:
        return Check("imex channel", OK, "not needed (no multi-node domain, no IMEX)")
    if channels is None:
        return Check("imex channel", WARN, f"{IMEX_CHANNELS_DIR} could not be read", "run doctor as root")
    if 0 in channels:
        return Check("imex channel", OK, f"{IMEX_CHANNELS_DIR}/channel0 present")
    todo = (
        f"create it: mkdir {IMEX_CHANNELS_DIR}; mknod {IMEX_CHANNELS_DIR}/channel0 c <major> 0 (the major from "
        "grep nvidia-caps-imex-channels /proc/devices); channels do not survive a reboot, so make it a boot unit"
    )
    if channels:
        return Check("imex channel", WARN, f"channels {channels} present but not channel0", todo)
    return Check("imex channel", FAIL, f"no {IMEX_CHANNELS_DIR}/channel0: CUDA cannot import memory across nodes", todo)


# --- MIG ------------------------------------------------------------------------------------------------------------


def check_mig(report: dict[str, Any]) -> list[Check]:
    """Each card's MIG mode and instances; a warning where nothing can run (on and empty, or waiting for a reset)."""
    gpus = report.get("gpus") or []
    instances: dict[int, list[dict[str, Any]]] = {}
    for g in gpus:
        if "parent" in g:
            instances.setdefault(g["parent"], []).append(g)
    rows = [_mig_card(card) for card in _cards(report)]
    rows += [_mig_instances(parent, found) for parent, found in sorted(instances.items())]
    rows = [r for r in rows if r is not None]
    if not rows:
        return [Check("mig", OK, _no_mig(_cards(report)))]
    return sorted(rows, key=lambda c: -_RANK[c.status])


def _no_mig(cards: list[dict[str, Any]]) -> str:
    modes = {c.get("mig_mode") for c in cards}
    if not cards:
        return "no GPU"
    if modes == {None}:
        return "MIG mode not reported"
    return "no card supports MIG" if modes <= {"not supported", None} else "MIG off on every card"


def _pending(mode: str) -> bool:
    return "pending" in mode


def _mig_card(card: dict[str, Any]) -> Check | None:
    mode, label = str(card.get("mig_mode") or ""), _label(card)
    reset = f"reset the GPU when idle (nvidia-smi -r -i {label}) or reboot"
    if _pending(mode):
        return Check("mig", WARN, f"gpu {label}: MIG {mode}: the change waits for a GPU reset", reset)
    if not mode.startswith("enabled"):
        return None
    if MIG_EMPTY in (card.get("health") or []):
        return Check(
            "mig",
            WARN,
            f"gpu {label}: MIG on with no instance carved: nothing can run on it",
            f"carve instances (nvidia-smi mig -i {label} -cgi <profiles> -C) or turn MIG off "
            f"(nvidia-smi -i {label} -mig 0, then a reset)",
        )
    return Check("mig", WARN, f"gpu {label}: MIG on, instances not listed by this source", "give nvidia-smi -L too")


def _mig_instances(parent: int, found: list[dict[str, Any]]) -> Check:
    profiles = Counter(g.get("mig_profile") or "unknown profile" for g in found)
    shape = ", ".join(f"{n}× {p}" for p, n in sorted(profiles.items()))
    seen = f"gpu {parent}: MIG on, {len(found)} instance{'s' if len(found) > 1 else ''} ({shape})"
    mode = str(found[0].get("mig_mode") or "")
    if _pending(mode):
        return Check("mig", WARN, f"{seen}; MIG {mode}", f"reset the GPU when idle (nvidia-smi -r -i {parent})")
    if "unknown profile" in profiles or any(not g.get("mig_uuid") for g in found):
        # Placement runs an engine on an instance by its MIG UUID and matches profiles by name.
        return Check("mig", WARN, f"{seen}; MIG UUIDs or profiles unknown", "give nvidia-smi -L too (it names both)")
    return Check("mig", OK, seen)


# --- host -----------------------------------------------------------------------------------------------------------


def check_avx2(report: dict[str, Any]) -> Check:
    """AVX2 on x86-64: CPU engines and most builds of the tokenizers need it; a VM hides it unless told."""
    host = report.get("host")
    if not isinstance(host, dict) or not host.get("arch"):
        return Check("avx2", WARN, "host facts not readable", "run doctor on the node itself")
    arch, flags = host["arch"], host.get("cpu_flags")
    if arch not in X86:
        return Check("avx2", OK, f"{arch}: AVX2 does not apply")
    if flags is None:
        return Check("avx2", WARN, "CPU flags not readable (/proc/cpuinfo)", "check /proc/cpuinfo is readable")
    if "avx2" in flags:
        return Check("avx2", OK, "AVX2 present")
    virt = host.get("virtualization")
    where = f" (virtualization: {virt})" if virt and virt != "none" else ""
    return Check(
        "avx2",
        WARN,
        f"no AVX2 on {arch}{where}: CPU engines will refuse to start or crawl",
        'in a VM set the CPU type to "host" (Proxmox: cpu: host; libvirt: host-passthrough) and restart it',
    )


def check_disks(report: dict[str, Any], facts: Facts) -> list[Check]:
    """Room for weights on the disk under each model directory."""
    if not facts.model_dirs:
        return [
            Check(
                "disk room",
                WARN,
                "no model directory configured",
                "give --model-dir (or model_dirs in agent.yaml) so doctor can check the room for weights",
            )
        ]
    disks = report.get("disks")
    if disks is None:
        why = "; ".join(p for p in report.get("problems") or [] if p.startswith("disks:")) or "not read"
        return [Check("disk room", WARN, f"disks not readable: {why}", "run doctor on the node itself")]
    return [_disk_room(d, disks, facts) for d in facts.model_dirs]


def _disk_room(model_dir: str, disks: list[dict[str, Any]], facts: Facts) -> Check:
    if model_dir in facts.missing_model_dirs:
        return Check(
            "disk room",
            FAIL,
            f"{model_dir} does not exist",
            f"create it (mkdir -p {model_dir}) or fix the configured model_dirs",
        )
    disk = next((d for d in disks if model_dir in (d.get("model_dirs") or [])), None)
    if disk is None:
        return Check(
            "disk room",
            WARN,
            f"{model_dir}: on no disk discovery lists (a tmpfs or a container's view?)",
            "put model directories on a real disk",
        )
    if "free_bytes" not in disk:
        return Check(
            "disk room",
            FAIL,
            f"{model_dir}: {disk.get('error', 'free space unknown')}",
            f"check the mount {disk['mount']} (a hung network mount?)",
        )
    free, total = disk["free_bytes"], disk.get("total_bytes") or 0
    seen = f"{model_dir}: {_size(free)} free of {_size(total)} on {disk['mount']} ({disk.get('fstype', '?')}"
    seen += ", shared)" if disk.get("shared") else ")"
    if free < FAIL_FREE_BYTES:
        return Check("disk room", FAIL, seen, "free space: remove weights nobody uses, or grow the disk")
    if free < WARN_FREE_BYTES:
        return Check("disk room", WARN, seen, "room for one large model at most: free space or grow the disk")
    return Check("disk room", OK, seen)


# --- the control plane ----------------------------------------------------------------------------------------------


def check_control_plane(reach: Reach | None) -> Check:
    """The control plane answers this node's credential (a heartbeat ``{}``)."""
    if reach is None:
        return Check("control plane", OK, "not tried (--offline)")
    if not reach.registered:
        return Check(
            "control plane",
            WARN,
            f"not registered: no credential in {reach.credential_file}",
            "start the agent once with --join-token (or LLMGW_JOIN_TOKEN)",
        )
    who = f"{reach.server} as {reach.node}"
    if reach.status is None:
        return Check(
            "control plane",
            FAIL,
            f"{who} unreachable: {reach.error}",
            "check the address, DNS, the firewall and that llmgw serve runs there",
        )
    if reach.status == 401:
        return Check(
            "control plane",
            FAIL,
            f"{who}: credential revoked: register again",
            f"delete {reach.credential_file} and start the agent with --join-token",
        )
    if reach.status >= 500:
        return Check(
            "control plane",
            FAIL,
            f"{who} is failing: it answered {reach.status}",
            "read the control plane's log (llmgw serve) around this time",
        )
    if reach.status >= 400:
        return Check(
            "control plane",
            FAIL,
            f"{who} refused the heartbeat ({reach.status}): {reach.error}",
            "read the refusal; a newer agent may be needed",
        )
    return Check("control plane", OK, f"{who}: heartbeat accepted")
