"""The Debian tools the deploy/ files are checked with, installed the way scripts/ensure-services installs.

Missing and run as root: installed with apt-get (update, then install -y).
A test skips, saying why, only when the tool still cannot be had.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent
DEPLOY = ROOT / "deploy"


def ensure(command: str, package: str) -> str:
    """The path of ``command``, installing Debian's ``package`` when it is missing; skip when it cannot be."""
    found = shutil.which(command) or shutil.which(command, path="/usr/sbin:/sbin")
    if found:
        return found
    if os.geteuid() != 0:
        pytest.skip(f"{command} is missing and installing {package} with apt-get needs root")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for step in (["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", package]):
        done = subprocess.run(step, env=env, capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            pytest.skip(f"{command} is missing and '{' '.join(step)}' failed: {done.stderr.strip()[-300:]}")
    found = shutil.which(command) or shutil.which(command, path="/usr/sbin:/sbin")
    if not found:
        pytest.skip(f"{package} was installed but gives no {command}")
    return found


def env_file(path: Path) -> dict[str, str]:
    """NAME=value lines of an environment file (systemd's EnvironmentFile, /etc/default/…), comments left out."""
    values = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            name, _, value = line.partition("=")
            values[name] = value
    return values
