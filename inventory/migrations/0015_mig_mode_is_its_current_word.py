"""A card's MIG mode is its current word: ``enabled (pending disable)`` is in MIG mode, as the scheduler reads it.

0012's recount held a card back only when its whole mode was one of the
"on" words, while placement's snapshot took any mode starting with
``enabled`` (in lower case only) as MIG mode. A card whose mode read
``enabled (pending disable)`` was free in the summary and ``/metrics`` and
held back by the scheduler: free GPUs no model would ever get. Both now
read inventory.devices.mig_enabled: the mode's leading ASCII letters, with
what Python strips stripped, in any case. The function is replaced whole
(CREATE OR REPLACE resets its settings, so 0013's plan setting is said
again) and every node counted again.
"""

import importlib

from django.db import migrations

_0012 = importlib.import_module("inventory.migrations.0012_node_devices")

OLD_HELD = f"lower(btrim(g.mig_mode, {_0012.PYTHON_WHITESPACE})) IN ('enabled', 'enable', 'on', 'true')"
NEW_HELD = (
    f"lower(substring(btrim(COALESCE(g.mig_mode, ''), {_0012.PYTHON_WHITESPACE}) from '^[A-Za-z]*'))"
    " IN ('enabled', 'enable', 'on', 'true')"
)
assert OLD_HELD in _0012.RECOUNT

PLANS = "ALTER FUNCTION inventory_recount_devices(bigint[]) SET plan_cache_mode = force_custom_plan;\n"
RECOUNT_ALL = "SELECT inventory_recount_devices(ARRAY(SELECT id FROM inventory_node));\n"


def recount(held: str):
    def run(apps, schema_editor) -> None:
        if schema_editor.connection.vendor == "postgresql":
            schema_editor.execute(_0012.RECOUNT.replace(OLD_HELD, held) + PLANS + RECOUNT_ALL, None)

    return run


class Migration(migrations.Migration):
    dependencies = [("inventory", "0014_heartbeats_hot")]

    operations = [migrations.RunPython(recount(NEW_HELD), recount(OLD_HELD))]
