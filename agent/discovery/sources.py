"""Where discovery reads from.

Each capture path, when set, replaces the live source: ``--nvidia-smi-xml``
makes the report come from that file instead of running ``nvidia-smi``. The
roots let a test point the sysfs, procfs and /dev readers at a directory.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Sources:
    nvidia_smi_xml: Path | None = None  # nvidia-smi -q -x
    nvidia_smi_text: Path | None = None  # nvidia-smi -q
    nvidia_smi_list: Path | None = None  # nvidia-smi -L
    topo: Path | None = None  # nvidia-smi topo -m
    imex_status: Path | None = None  # nvidia-imex-ctl -N
    ibstat: Path | None = None  # ibstat (or ibstatus) output
    sysfs_root: Path = Path("/sys")
    proc_root: Path = Path("/proc")
    dev_root: Path = Path("/dev")
    etc_root: Path = Path("/etc")
    use_nvml: bool = True
    model_dirs: tuple[Path, ...] = field(default_factory=tuple)

    @property
    def replaying_gpus(self) -> bool:
        """True when the GPU facts come from captures, so NVML and live nvidia-smi are not consulted."""
        return any((self.nvidia_smi_xml, self.nvidia_smi_text, self.nvidia_smi_list))
