"""WeightCollection moved from the REST app to the catalog: same table, no row copied, none lost.

The migrations change only Django's idea of which app owns the model
(``SeparateDatabaseAndState``); the table keeps its name. The test stores a
row as the schema stood before the move, migrates forward, and reads it back
through the catalog's model.
"""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from catalog.models import WeightCollection

pytestmark = pytest.mark.django_db(transaction=True)

BEFORE = [("api", "0001_initial"), ("catalog", "0003_catalog_file")]
AFTER = [("api", "0002_weightcollection_to_catalog"), ("catalog", "0004_weightcollection_from_api")]


def migrate(targets: list[tuple[str, str]]) -> MigrationExecutor:
    executor = MigrationExecutor(connection)
    executor.migrate(targets)
    return MigrationExecutor(connection)  # a fresh one: the loader reads what is applied now


def test_a_row_stored_before_the_move_is_there_after_it():
    executor = migrate(BEFORE)
    try:
        old = executor.loader.project_state(BEFORE).apps.get_model("api", "WeightCollection")
        old.objects.create(node="hgx-001", path="/models/old", name="old", bytes=10**9, requested_by="olive")
        migrate(AFTER)
        row = WeightCollection.objects.get()
        assert (row.node, row.path, row.bytes, row.requested_by) == ("hgx-001", "/models/old", 10**9, "olive")
        assert row.pending
    finally:
        migrate(MigrationExecutor(connection).loader.graph.leaf_nodes())


def test_the_table_keeps_its_name():
    assert WeightCollection._meta.db_table == "api_weightcollection"
    assert WeightCollection._meta.app_label == "catalog"


def test_the_models_and_the_migrations_agree():
    out = StringIO()
    call_command("makemigrations", "--check", "--dry-run", stdout=out)
    assert "No changes detected" in out.getvalue()
