"""Small hand-built reports shaped like the agent's, for the protocol tests."""

from __future__ import annotations

import copy

CLUSTER = "5c7e1f9a-8d1b-4e5e-9d52-2b1c3a4d5e6f"


def gpu(index: int, *, joined: bool = True, clique: int = 32766, degraded: bool = False) -> dict:
    return {
        "index": index,
        "uuid": f"GPU-{index:08d}-0000-0000-0000-000000000000",
        "name": "NVIDIA GB200",
        "class": "gb200-185g",
        "memory_mb": 189471,
        "pci_bus": f"00000008:0{index}:00.0",
        "numa": index // 2,
        "nvlink_peers": [i for i in range(4) if i != index],
        "nics": {"mlx5_0": "NODE"},
        "health": [],
        "fabric": {
            "state": "Completed" if joined else "In Progress",
            "status": "Success" if joined else "N/A",
            "cluster_uuid": CLUSTER if joined else "00000000-0000-0000-0000-000000000000",
            "clique_id": clique if joined else 0,
            "health_summary": "Healthy",
            "bandwidth": "Degraded" if degraded else "Full",
            "degraded": degraded,
            "problems": [],
        },
        "mig_mode": "disabled",
        "temperature_c": 40 + index,
    }


BASE = {
    "agent_version": "0.1.0",
    "hostname": "tray-01.rack-a",
    "gpus": [gpu(i) for i in range(4)],
    "ib_ports": [
        {
            "hca": "mlx5_0",
            "port": 1,
            "state": "ACTIVE",
            "phys_state": "LinkUp",
            "rate_gbps": 400.0,
            "link_layer": "InfiniBand",
            "node_guid": "0xa088c20300000001",
            "port_guid": "0xa088c20300000001",
            "sm_lid": 1,
            "sm_guid": "0x248a0703005c3440",
            "counters": {"symbol_error": 0},
        }
    ],
    "host": {
        "os": "ubuntu",
        "os_version": "24.04",
        "arch": "aarch64",
        "cpu_flags": ["fp", "asimd"],
        "memory_mb": 884000,
    },
    "imex": {"state": "up", "channels": [0], "nodes": [{"index": 0, "address": "10.0.0.1", "status": "READY"}]},
    "load": {"cpu_percent": 3.5, "load1": 0.2},
    "engines": {"vllm": "0.11.0"},
    "disks": [],
    "problems": [],
}


def report(**changes) -> dict:
    out = copy.deepcopy(BASE)
    out.update(changes)
    return out
