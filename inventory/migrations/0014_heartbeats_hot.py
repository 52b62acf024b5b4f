"""A heartbeat rewrites its node's row in place: no index on what it writes, room in each page for it.

Every node's row is written every 5 s (last_seen, load, shard state): at
10,000 nodes, 2,000 rows a second. With last_seen indexed, each write was a
new row version in whatever page had room plus an entry in each of the
table's nine indexes, and the table grew to eight times its live rows
between vacuums (59 MB for 7 MB of nodes after 30 s of beats), which every
read of the fleet then scanned. With no index on a written column and half
of each page left free (fillfactor 50), PostgreSQL writes the new version
beside the old one in the same page and touches no index (a heap-only
tuple, "HOT"), and prunes the old versions as the page fills.

The one reader of last_seen by range, the reachability sweep (every 5 s),
now reads the whole table for the silent nodes: 14 ms at 10,000 nodes,
where the index found them in 0.1 ms. Against that, PostgreSQL's CPU per
heartbeat fell from 0.055 to 0.024 ms (bench/scale.py at 10,000 nodes, 1,833
beats a second: about 55 ms of a core each second), and the table after 30 s
of beats from 59 MB to 20 MB (indexes 9.5 to 5 MB). A table created before
this keeps its full pages until its rows move; each later write fills pages
to half.
"""

from django.db import migrations, models

FILL = "ALTER TABLE inventory_node SET (fillfactor = 50)"
UNFILL = "ALTER TABLE inventory_node RESET (fillfactor)"


def half_full(apps, schema_editor) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(FILL, None)


def full(apps, schema_editor) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(UNFILL, None)


class Migration(migrations.Migration):
    dependencies = [("inventory", "0013_recount_plans")]

    operations = [
        migrations.AlterField(model_name="node", name="last_seen", field=models.DateTimeField(blank=True, null=True)),
        migrations.RunPython(half_full, full),
    ]
