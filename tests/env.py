"""Test environment, loaded as a plugin (``-p tests.env`` in pyproject.toml) before Django is set up.

The settings read the environment at import, and pytest-django sets Django up
before any conftest.py is read — so the data dir and the database are chosen
here, in a plugin pytest imports first. Tests run on PostgreSQL
(``LLMGW_TEST_DATABASE_URL``, default the local server) as DESIGN.md asks;
``LLMGW_TEST_SQLITE=1`` is an escape hatch for a quick run without it.
"""

from __future__ import annotations

import os
import tempfile

_data = tempfile.mkdtemp(prefix="llmgw-test-")
os.environ.setdefault("LLMGW_DATA_DIR", _data)
if not os.environ.get("LLMGW_TEST_SQLITE"):
    os.environ.setdefault(
        "LLMGW_DATABASE_URL",
        os.environ.get("LLMGW_TEST_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/llmgw"),
    )
# Heartbeats queued by the fast lane are flushed by the tests themselves.
os.environ.setdefault("LLMGW_HEARTBEAT_FLUSHER", "manual")
os.environ.setdefault("LLMGW_ADMIN_ADDR", "127.0.0.1:18000")
os.environ.setdefault("LLMGW_GATEWAY_ADDR", "127.0.0.1:18080")
