"""Django set up in a benchmark's own process, on a database of the benchmark's own."""

from __future__ import annotations

import os
import tempfile


def setup_django(database_url: str, prefix: str) -> None:
    """Django on ``database_url`` with a fresh data dir and no Redis, migrated."""
    os.environ.update(
        LLMGW_DATA_DIR=tempfile.mkdtemp(prefix=prefix),
        LLMGW_DATABASE_URL=database_url,
        DJANGO_SETTINGS_MODULE="llmgw.settings",
    )
    os.environ.pop("LLMGW_REDIS_URL", None)
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)
