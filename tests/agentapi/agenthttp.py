"""Speaking the agent protocol through Django's test client, and showing what a request changed."""

from __future__ import annotations

import json
from io import StringIO

from django.core.management import call_command


def post(client, path, body, token, raw: bytes | None = None):
    data = raw if raw is not None else json.dumps(body)
    return client.post(
        f"/api/v1/agent/{path}", data=data, content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {token}"
    )


def register(client, join, name="tray-01", machine_id="m-1", **extra):
    return post(client, "register", {"name": name, "machine_id": machine_id, **extra}, join)


def snapshot() -> str:
    """Every inventory row, as text, to show a refusal changed nothing.

    Except a node's ``report_error``: a refused report's one trace is why it
    was refused (tested: test_unstorable.py::test_a_refused_report_is_kept_on_the_node...).
    """
    out = StringIO()
    call_command("dumpdata", "inventory", stdout=out)
    rows = json.loads(out.getvalue())
    for row in rows:
        if row["model"] == "inventory.node":
            row["fields"].pop("report_error", None)
    return json.dumps(rows, sort_keys=True)
