"""Reading the database of an ``llmgw serve`` a test started with the embedded defaults (llmgw.embedded_db)."""

from __future__ import annotations

from pathlib import Path

import psycopg

from llmgw import embedded_db


def rows(data_dir: Path, sql: str, params: tuple = ()) -> list[tuple]:
    """The rows of one query on the PostgreSQL in ``data_dir``, as a person with psql would read them.

    While serve runs, its server is read without joining its users; once serve
    has stopped (and its server with it), the server is started again for this
    process, which stops it when it exits.
    """
    url = embedded_db.running_url(data_dir) or embedded_db.url(data_dir)
    with psycopg.connect(url, autocommit=True) as conn:
        return conn.execute(sql, params or None).fetchall()  # None: a % in the SQL is itself
