"""Test environment, loaded as a plugin (``-p tests.env`` in pyproject.toml) before Django is set up.

The settings read the environment at import, and pytest-django sets Django up
before any conftest.py is read — so the data dir and the database are chosen
here, in a plugin pytest imports first. Tests run on PostgreSQL
(``LLMGW_TEST_DATABASE_URL``, default the local server).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

# One folder for everything a run writes (the data dir, pytest's tmp_path folders),
# removed when the run ends so that a run leaves nothing in the temporary folder.
# LLMGW_TEST_KEEP_TMP=1 keeps it for a look after a failure. The data dir is always the
# run's own: `make` exports LLMGW_DATA_DIR=./data for `make run`, and a test run must
# neither read an operator's secrets there nor leave its own behind.
_root = Path(tempfile.mkdtemp(prefix="llmgw-test-"))
os.environ["LLMGW_DATA_DIR"] = str(_root / "data")
os.environ.setdefault(
    "LLMGW_DATABASE_URL", os.environ.get("LLMGW_TEST_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/llmgw")
)
# Several checkouts testing at once on one PostgreSQL must not share (and drop) one test database.
os.environ.setdefault("LLMGW_TEST_DB_NAME", "llmgw_test_budget")
# Heartbeats queued by the fast lane are flushed by the tests themselves.
os.environ.setdefault("LLMGW_HEARTBEAT_FLUSHER", "manual")
os.environ.setdefault("LLMGW_ADMIN_ADDR", "127.0.0.1:18000")
os.environ.setdefault("LLMGW_GATEWAY_ADDR", "127.0.0.1:18080")
# Tests send a node's reports back to back; those of the limit set it themselves (tests/agentapi/test_report_storms.py).
os.environ.setdefault("LLMGW_REPORT_MIN_INTERVAL_S", "0")


def pytest_configure(config) -> None:
    if config.option.basetemp is None:
        config.option.basetemp = str(_root / "pytest")


def pytest_unconfigure(config) -> None:
    if not os.environ.get("LLMGW_TEST_KEEP_TMP"):
        shutil.rmtree(_root, ignore_errors=True)
