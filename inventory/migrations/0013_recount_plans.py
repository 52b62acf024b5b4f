"""The recount of migration 0012 plans its statements for the node it is given, every time.

PL/pgSQL caches a function's plans per connection and, after five calls,
keeps a generic plan when it looks no dearer than the custom ones. On a
fresh install the first calls come while inventory_nodedevices is nearly
empty, so the generic plan it kept scanned the whole table to delete one
node's rows: every registration read every node's rows, and PostgreSQL's time
per registration grew with the fleet (bench/register_cost.py: seq_tup_read of
the table the square of the fleet over two). Planned for each call, the
DELETE finds the node's rows through the unique index that leads with node_id.
"""

from django.db import migrations

CUSTOM = "ALTER FUNCTION inventory_recount_devices(bigint[]) SET plan_cache_mode = force_custom_plan"
DEFAULT = "ALTER FUNCTION inventory_recount_devices(bigint[]) RESET plan_cache_mode"


def custom_plans(apps, schema_editor) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(CUSTOM, None)


def default_plans(apps, schema_editor) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DEFAULT, None)


class Migration(migrations.Migration):
    dependencies = [("inventory", "0012_node_devices")]

    operations = [migrations.RunPython(custom_plans, default_plans)]
