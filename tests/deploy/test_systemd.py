"""deploy/systemd: every unit passes ``systemd-analyze verify`` and runs what llmgw really has."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from llmgw.supervisor import WORKER_POOL
from tests.deploy.tools import DEPLOY, ensure

UNITS = sorted((DEPLOY / "systemd").glob("*.service"))
INSTALLED = "/opt/llmgw/bin"
"""Where the units expect the virtual environment (docs/install.md installs it there)."""


def verify(unit_text: str, name: str, tmp_path: Path) -> subprocess.CompletedProcess:
    """``systemd-analyze verify`` on the unit, with /opt/llmgw/bin standing for this test's own venv.

    verify checks that each ExecStart names an executable, so the unit is
    pointed at the llmgw and celery of the environment running the tests;
    nothing else is changed.
    """
    tool = ensure("systemd-analyze", "systemd")
    here = str(Path(sys.executable).parent)
    path = tmp_path / name
    path.write_text(unit_text.replace(INSTALLED, here))
    return subprocess.run([tool, "verify", "--man=no", str(path)], capture_output=True, text=True, timeout=60)


def test_the_four_units_are_shipped():
    assert [u.name for u in UNITS] == [
        "llmgw-agent.service",
        "llmgw-beat.service",
        "llmgw-serve.service",
        "llmgw-worker.service",
    ]


@pytest.mark.parametrize("unit", UNITS, ids=lambda u: u.name)
def test_each_unit_passes_systemd_analyze_verify(unit, tmp_path):
    done = verify(unit.read_text(), unit.name, tmp_path)
    assert done.returncode == 0 and not done.stderr.strip(), done.stderr


def test_verify_finds_a_broken_unit(tmp_path):
    """The check can fail: a misspelt directive and a program that is not there are both reported."""
    broken = (DEPLOY / "systemd" / "llmgw-serve.service").read_text()
    broken = broken.replace("Restart=always", "Restrat=always").replace("bin/llmgw serve", "bin/llmgw-nope serve")
    done = verify(broken, "llmgw-serve.service", tmp_path)
    assert "Restrat" in done.stderr and "llmgw-nope" in done.stderr


def exec_start(unit: Path) -> list[str]:
    line = next(x for x in unit.read_text().splitlines() if x.startswith("ExecStart="))
    return shlex.split(line.removeprefix("ExecStart="))


def test_the_units_run_llmgws_own_commands():
    """Serve leaves the worker to its unit; the worker and beat are Celery's for the llmgw app; one beat."""
    commands = {u.stem: exec_start(u) for u in UNITS}
    assert commands["llmgw-serve"][1:] == ["serve", "--no-worker"]
    assert commands["llmgw-agent"][1:3] == ["agent", "--config"]
    assert commands["llmgw-worker"][1:4] == ["-A", "llmgw", "worker"] and "-B" not in commands["llmgw-worker"]
    # The unit's worker runs its tasks as llmgw serve's does (threads: llmgw.supervisor.WORKER_POOL says why).
    worker = commands["llmgw-worker"]
    assert worker[worker.index(WORKER_POOL[0]) : worker.index(WORKER_POOL[0]) + len(WORKER_POOL)] == list(WORKER_POOL)
    assert commands["llmgw-beat"][1:4] == ["-A", "llmgw", "beat"]
    for unit in ("llmgw-serve", "llmgw-worker", "llmgw-beat"):
        assert "EnvironmentFile=/etc/llmgw/llmgw.env" in (DEPLOY / "systemd" / f"{unit}.service").read_text()


@pytest.mark.parametrize("unit", ["llmgw-serve", "llmgw-agent"])
def test_llmgw_accepts_the_units_arguments(unit):
    """The unit's command line is one llmgw takes: --help after it exits 0 once the rest has been parsed."""
    args = exec_start(DEPLOY / "systemd" / f"{unit}.service")[1:]
    done = subprocess.run(
        [str(Path(sys.executable).parent / "llmgw"), *args, "--help"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and "usage: llmgw" in done.stdout, done.stderr
