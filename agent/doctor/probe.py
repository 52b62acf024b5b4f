"""The facts doctor gathers beyond discovery: the PCI bus, the model dirs, and a call to the control plane.

Thin I/O; each reader takes its root or its HTTP function so a test can give
it a fake tree or a fake server. Nothing here raises for what it finds.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import httpx

from agent import protocol
from agent.doctor.checks import Reach

CREDENTIAL_FILE = "credential.json"  # as agent.agent_cmd writes it
NVIDIA_VENDOR = "0x10de"
# PCI classes of GPUs: VGA (0x0300xx) and 3D controllers (0x0302xx). NVSwitches are bridges (0x0680xx), not GPUs.
GPU_CLASSES = ("0x0300", "0x0302")
TIMEOUT_S = 5.0

Post = Callable[..., httpx.Response]


def nvidia_pci_devices(sysfs_root: Path) -> int | None:
    """How many NVIDIA GPUs the PCI bus shows, whatever the driver says; None when the bus cannot be read."""
    devices = sysfs_root / "bus" / "pci" / "devices"
    try:
        entries = list(devices.iterdir())
    except OSError:
        return None
    count = 0
    for entry in entries:
        try:
            vendor = (entry / "vendor").read_text().strip().lower()
            klass = (entry / "class").read_text().strip().lower()
        except OSError:
            continue
        count += vendor == NVIDIA_VENDOR and klass.startswith(GPU_CLASSES)
    return count


def model_dirs(dirs: Iterable[Path]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(real paths, those that do not exist): discovery files model dirs under their real paths."""
    real = tuple(os.path.realpath(d) for d in dirs)
    return real, tuple(d for d in real if not Path(d).is_dir())


def read_credential(state_dir: Path) -> dict[str, Any] | None:
    """The agent's kept credential (server, node, credential), or None when there is none readable."""
    try:
        saved = json.loads((state_dir / CREDENTIAL_FILE).read_text())
    except (OSError, ValueError):
        return None
    return saved if isinstance(saved, dict) and saved.get("credential") else None


def reach_control_plane(state_dir: Path, server: str | None = None, post: Post = httpx.post) -> Reach:
    """POST a heartbeat ``{}`` with this node's credential; ``server`` overrides the one the credential names.

    A heartbeat is the least a node can say: it changes nothing but the node's
    last-seen time, which a running doctor proves anyway.
    """
    path = str(state_dir / CREDENTIAL_FILE)
    saved = read_credential(state_dir)
    if saved is None:
        return Reach(credential_file=path, registered=False)
    base = (server or saved.get("server") or "").rstrip("/")
    node = saved.get("node")
    if not base:
        return Reach(path, True, None, node, None, f"{path} names no server; give --server")
    try:
        answer = post(
            base + protocol.HEARTBEAT_PATH,
            json={},
            headers={"Authorization": f"Bearer {saved['credential']}"},
            timeout=TIMEOUT_S,
        )
    except httpx.HTTPError as exc:
        return Reach(path, True, base, node, None, f"{type(exc).__name__}: {exc}")
    return Reach(path, True, base, node, answer.status_code, _refusal(answer))


def _refusal(answer: httpx.Response) -> str | None:
    if answer.status_code < 400:
        return None
    try:
        body = answer.json()
    except ValueError:
        return answer.text[:200] or None
    return body.get("error") if isinstance(body, dict) else None
