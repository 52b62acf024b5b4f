"""A live ``llmgw serve`` on a PostgreSQL database of its own, and what the suite reads from it.

- ``Database``: a fresh database (``llmgw_hostile_<random>``), created with
  psycopg and dropped with the session.
- ``Serve``: the server as a subprocess on free ports, without its worker:
  no periodic task (sweeps, reconciler, planner) moves rows under the
  snapshots, so any change between two snapshots is the request's doing.
- ``Snapshot``: the stored tables read straight from PostgreSQL, long text
  as a digest, liveness columns left out.
- ``Orm``: ``tests.hostile.orm`` in the server's environment.
- ``Log``: the server's log, read on from where it was last read, with each
  traceback summed up in a line.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
import psycopg

from tests.core.test_serve import free_port

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 90
HEARTBEAT_FLUSH_S = 0.02

# Tables that hold what the fleet, the catalog and the tenants are; audit, sessions and
# Django's own bookkeeping are left out (a refusal may be audited; that is not a change).
TABLES = (
    "inventory_node",
    "inventory_gpu",
    "inventory_ibport",
    "inventory_nvlinkdomain",
    "inventory_fabricscan",
    "inventory_fleetevent",
    "inventory_subnetmanagerchange",
    "inventory_jointoken",
    "catalog_catalogmodel",
    "catalog_profile",
    "catalog_alias",
    "catalog_fallback",
    "catalog_capacitymeasurement",
    "placement_replica",
    "placement_shard",
    "placement_demand",
    "gateway_organisation",
    "gateway_team",
    "gateway_apikey",
    "gateway_budget",
    "gateway_price",
    "gateway_usagerecord",
    "gateway_usagehour",
    "gateway_ratewindow",
    "api_weightcollection",
    "core_apitoken",
    "auth_user",
)
# Liveness, written by every accepted beat or request: not state a refusal could corrupt.
VOLATILE = {"last_seen", "last_used_at", "last_login"}
# The one trace a refused report keeps, by design: the node says why its report was refused
# (docs/api.md, tests/agentapi/test_unstorable.py). Any other column a refusal moves is a finding.
REFUSAL_TRACES = {"report_error"}
# Written by the gateway for refused requests too, by design: a refusal after admission is recorded.
USAGE_TABLES = {"gateway_usagerecord", "gateway_usagehour", "gateway_ratewindow", "placement_demand"}


def admin_database_url() -> str:
    """The PostgreSQL server the tests use (``LLMGW_TEST_DATABASE_URL``), at its maintenance database."""
    url = os.environ.get("LLMGW_TEST_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/llmgw")
    return with_database(url, "postgres")


def with_database(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{name}"))


class Database:
    """A database of the suite's own, on the tests' PostgreSQL server."""

    def __init__(self) -> None:
        self.name = f"llmgw_hostile_{secrets.token_hex(4)}"
        self.admin_url = admin_database_url()
        self.url = with_database(self.admin_url, self.name)
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{self.name}"')

    def drop(self) -> None:
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')


def server_env(data: Path, admin: str, gateway: str, database_url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLMGW_")}
    env.update(
        LLMGW_DATA_DIR=str(data),
        LLMGW_ADMIN_ADDR=admin,
        LLMGW_GATEWAY_ADDR=gateway,
        LLMGW_DATABASE_URL=database_url,
        LLMGW_HEARTBEAT_FLUSH_S=str(HEARTBEAT_FLUSH_S),
        LLMGW_GATEWAY_FLUSH_EVERY_S="0.01",
        LLMGW_GATEWAY_REFRESH_S="0.2",
        LLMGW_GATEWAY_TOUCH_EVERY_S="3600",
        # A node's mutants are sent back to back: the rate of full reports would refuse all but one a second
        # before their bodies are read. That limit holds in tests/agentapi/test_report_storms.py.
        LLMGW_REPORT_MIN_INTERVAL_S="0",
        PYTHONUNBUFFERED="1",
    )
    return env


class Serve:
    """``llmgw serve --no-worker`` as a subprocess; its log in ``serve.log`` under ``root``."""

    def __init__(self, root: Path, database_url: str) -> None:
        self.data = root / "data"
        self.admin = f"127.0.0.1:{free_port()}"
        self.gateway = f"127.0.0.1:{free_port()}"
        self.env = server_env(self.data, self.admin, self.gateway, database_url)
        self.log_path = root / "serve.log"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "llmgw.cli", "serve", "--no-worker"],
            cwd=REPO,
            env=self.env,
            stdout=self.log_path.open("w"),
            stderr=subprocess.STDOUT,
        )
        self.log = Log(self.log_path)

    def wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.log_path.read_text()
            if self.healthy(f"http://{self.admin}") and self.healthy(f"http://{self.gateway}"):
                return
            time.sleep(0.2)
        raise AssertionError("llmgw serve did not answer /healthz:\n" + self.log_path.read_text())

    @staticmethod
    def healthy(base: str) -> bool:
        try:
            return httpx.get(f"{base}/healthz", timeout=10).status_code == 200
        except httpx.TransportError:
            return False

    def secret(self, name: str) -> str:
        return (self.data / name).read_text().strip()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class Orm:
    """``tests.hostile.orm`` running in the server's environment, called a function at a time."""

    def __init__(self, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.hostile.orm"],
            cwd=REPO,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert json.loads(self._line()) == {"ready": True}

    def _line(self) -> str:
        line = self.proc.stdout.readline()
        assert line, "tests.hostile.orm ended; its error is above"
        return line

    def call(self, name: str, **args: Any) -> Any:
        self.proc.stdin.write(json.dumps({"call": name, "args": args}) + "\n")
        self.proc.stdin.flush()
        answer = json.loads(self._line())
        assert "error" not in answer, answer.get("error")
        return answer["ok"]

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()


TRACEBACK = "Traceback (most recent call last):"
FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>\S+)')


class Log:
    """The server's log, read a new part at a time."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0

    def new(self) -> str:
        """What was written since the last call."""
        data = self.peek()
        self.offset += len(data.encode())
        return data

    def peek(self) -> str:
        """What was written since the last ``new``, left to be read by the next."""
        with self.path.open("rb") as handle:
            handle.seek(self.offset)
            return handle.read().decode("utf-8", "replace")

    @staticmethod
    def tracebacks(text: str) -> list[str]:
        """Each traceback in ``text`` summed up: its exception line, and the last frame in llmgw's code."""
        out = []
        for block in text.split(TRACEBACK)[1:]:
            lines = [line for line in block.splitlines() if line.strip()]
            ours = [m for line in lines if (m := FRAME.match(line)) and str(REPO) in m["file"]]
            exception = next((line.strip() for line in lines if not line.startswith((" ", "\t")) and ":" in line), "?")
            where = ""
            if ours:
                last = ours[-1]
                where = f" at {os.path.relpath(last['file'], REPO)}:{last['line']} in {last['func']}"
            out.append(f"{exception[:300]}{where}")
        return out


@dataclass
class Snapshot:
    """The stored rows, by table: each table's rows as one JSON text, volatile columns left out."""

    tables: dict[str, str] = field(default_factory=dict)

    def diff(self, other: Snapshot, limit: int = 3) -> list[str]:
        """What differs, in a few lines: table, rows added, removed or changed (by id)."""
        out = []
        for table in sorted(set(self.tables) | set(other.tables)):
            before, after = self.tables.get(table, "[]"), other.tables.get(table, "[]")
            if before == after:
                continue
            old = {json.dumps(next(iter(row.values()))): row for row in json.loads(before)}
            new = {json.dumps(next(iter(row.values()))): row for row in json.loads(after)}
            parts = []
            if added := [k for k in new if k not in old]:
                parts.append(f"{len(added)} row(s) added (id {added[0]})")
            if removed := [k for k in old if k not in new]:
                parts.append(f"{len(removed)} row(s) removed (id {removed[0]})")
            for k in [k for k in old if k in new and old[k] != new[k]][:2]:
                columns = [c for c in old[k] if old[k][c] != new[k].get(c)]
                parts.append(f"row {k} changed ({', '.join(columns)})")
            out.append(f"{table}: " + ", ".join(parts or ["rows reordered"]))
        return out[:limit] + ([f"… and {len(out) - limit} more tables"] if len(out) > limit else [])


class Store:
    """Reads the server's database straight, with psycopg: the suite's view of 'what is stored'.

    Each snapshot is one query (a JSON text per table), so that judging a
    mutant costs one round trip rather than one per table.
    """

    def __init__(self, url: str) -> None:
        self.conn = psycopg.connect(url, autocommit=True)
        self.columns = self._columns()
        self.everything = {t: self._rows(t) for t in self.columns}

    def _columns(self) -> dict[str, list[tuple[str, str]]]:
        rows = self.conn.execute(
            "SELECT table_name, column_name, data_type FROM information_schema.columns "
            "WHERE table_schema = 'public' AND table_name = ANY(%s) ORDER BY table_name, ordinal_position",
            [list(TABLES)],
        ).fetchall()
        out: dict[str, list[tuple[str, str]]] = {}
        for table, column, kind in rows:
            if column not in VOLATILE | REFUSAL_TRACES:
                out.setdefault(table, []).append((column, kind))
        return out

    def _rows(self, table: str, where: str = "", only: tuple[str, ...] = ()) -> str:
        """A scalar subquery: the table's rows (without volatile columns) as one JSON array, ordered by id."""
        columns = [(c, kind) for c, kind in self.columns[table] if not only or c in only]
        # Long text and JSON as a digest: a 300 kB fabric map read twice a request would be the suite's cost.
        row = ", ".join(
            f"'{c}', " + (f'md5(t."{c}"::text)' if kind in ("text", "jsonb") else f't."{c}"') for c, kind in columns
        )
        return (
            f"(SELECT coalesce(json_agg(json_build_object({row}) ORDER BY t.\"{columns[0][0]}\"), '[]')::text "
            f'FROM "{table}" AS t {where})'
        )

    def _read(self, parts: dict[str, str], args: dict[str, Any] | None = None) -> Snapshot:
        names = list(parts)
        row = self.conn.execute("SELECT " + ", ".join(parts[n] for n in names), args or {}).fetchone()
        return Snapshot(dict(zip(names, row, strict=True)))

    def snapshot(self, skip: Iterable[str] = ()) -> Snapshot:
        skipped = set(skip)
        return self._read({t: q for t, q in self.everything.items() if t not in skipped})

    def owned_by(self, node_id: int, node_name: str) -> Snapshot:
        """Every row that belongs to one node: what no other node's request may change.

        A replica with rank 0 on this node is this node's in its endpoint (where
        the gateway sends clients' requests); a replica wholly on it, in every column.
        """
        by_node = (
            "inventory_gpu",
            "inventory_ibport",
            "placement_shard",
            "inventory_fabricscan",
            "inventory_fleetevent",
            "inventory_subnetmanagerchange",
        )
        parts = {t: self._rows(t, f"WHERE node_id = {int(node_id)}") for t in by_node}
        parts["inventory_node"] = self._rows("inventory_node", f"WHERE id = {int(node_id)}")
        parts["api_weightcollection"] = self._rows("api_weightcollection", "WHERE node = %(name)s")
        parts["placement_replica (rank 0 here: its endpoint)"] = self._rows(
            "placement_replica",
            f"WHERE id IN (SELECT replica_id FROM placement_shard WHERE node_id = {int(node_id)} AND rank = 0)",
            ("id", "endpoint"),
        )
        parts["placement_replica (wholly here)"] = self._rows(
            "placement_replica",
            "WHERE id IN (SELECT replica_id FROM placement_shard GROUP BY replica_id "
            f"HAVING bool_and(node_id = {int(node_id)}))",
        )
        return self._read(parts, {"name": node_name})

    def value(self, sql: str, *args: Any) -> Any:
        row = self.conn.execute(sql, list(args)).fetchone()
        return row[0] if row else None

    def close(self) -> None:
        self.conn.close()
