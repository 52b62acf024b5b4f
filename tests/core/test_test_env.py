"""A test run leaves nothing in the temporary folder (issue #19): tests/env.py keeps it all in one folder."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_a_run_leaves_nothing_in_the_temporary_folder(tmp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "test_one.py").write_text("def test_writes(tmp_path):\n    (tmp_path / 'x').write_text('x')\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLMGW_")}
    # As `make test` runs it: the Makefile exports LLMGW_DATA_DIR (./data) for `make run`.
    operator_data = tmp_path / "data"
    env.update(TMPDIR=str(tmp), PYTHONPATH=str(ROOT), LLMGW_DATA_DIR=str(operator_data))
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "tests.env",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:django",
            str(tmp_path / "t" / "test_one.py"),
            "--rootdir",
            str(tmp_path / "t"),
        ],
        env=env,
        cwd=tmp_path / "t",
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert sorted(p.name for p in tmp.iterdir()) == []
    assert not operator_data.exists()
