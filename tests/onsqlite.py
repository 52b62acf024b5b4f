"""A check run in a process of its own on a migrated SQLite file, the embedded default.

The suite runs on PostgreSQL; code that builds its SQL per database (the
fingerprints, the node listing) is also run once on SQLite this way. The
script sets Django up and migrates itself, so it starts as ``llmgw serve``
would on a fresh data dir.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PREAMBLE = """
import django
django.setup()
from django.core.management import call_command
from django.db import connection
call_command("migrate", verbosity=0)
assert connection.vendor == "sqlite", connection.vendor
"""


def run(script: str, tmp_path: Path) -> str:
    """What ``script`` printed, run after ``PREAMBLE`` against a SQLite file in ``tmp_path``; its failure fails."""
    env = {
        **os.environ,
        "LLMGW_DATA_DIR": str(tmp_path),
        "LLMGW_DATABASE_URL": f"sqlite:///{tmp_path}/llmgw.sqlite3",
        "DJANGO_SETTINGS_MODULE": "llmgw.settings",
        "PYTHONPATH": str(ROOT),
    }
    done = subprocess.run(
        [sys.executable, "-c", PREAMBLE + script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout
