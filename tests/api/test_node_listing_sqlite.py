"""The node listing on SQLite, the embedded default: the same bytes as the views, without PostgreSQL's pipeline.

The suite runs on PostgreSQL, where the listing's queries are sent ahead of
their reading (core.pipelined); on SQLite each is run when sent and its rows
go through Django's converters (a boolean is stored as 0 or 1). Checked here
in a process of its own on a migrated SQLite file.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CHECK = """
import django
django.setup()
from django.core.management import call_command
from django.db import connection
from django.utils import timezone
call_command("migrate", verbosity=0)
assert connection.vendor == "sqlite", connection.vendor
from inventory.models import Node
from tests.api.test_node_listing_json import listed_pages, reference_pages
from tests.placement.dbfleet import fleet
fleet("h100-hgx:3,gb200-nvl72:1,a100-mig:2,cpu:2")
Node.objects.create(name="bare")
now = timezone.now()
for size in (3, None):
    for fields in (None, frozenset({"id", "reachable", "gpus"}), frozenset({"ib_ports", "lost"})):
        got = listed_pages(now, fields, size)
        assert got == reference_pages(now, fields, size), (size, fields)
print("listed", sum(len(p) for p in got))
"""


def test_the_listing_on_sqlite_is_the_json_of_the_views(tmp_path):
    env = {
        **os.environ,
        "LLMGW_DATA_DIR": str(tmp_path),
        "LLMGW_DATABASE_URL": f"sqlite:///{tmp_path}/llmgw.sqlite3",
        "DJANGO_SETTINGS_MODULE": "llmgw.settings",
        "PYTHONPATH": str(ROOT),
    }
    done = subprocess.run([sys.executable, "-c", CHECK], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "listed 26" in done.stdout
