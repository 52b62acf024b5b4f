"""The node listing on SQLite, the embedded default: the same bytes as the views, without PostgreSQL's pipeline.

The suite runs on PostgreSQL, where the listing's queries are sent ahead of
their reading (core.pipelined); on SQLite each is run when sent and its rows
go through Django's converters (a boolean is stored as 0 or 1). Checked here
in a process of its own on a migrated SQLite file.
"""

from __future__ import annotations

from tests import onsqlite

CHECK = """
from django.utils import timezone
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
    assert "listed 26" in onsqlite.run(CHECK, tmp_path)
