"""First start, once: even when several control hosts start together on a fresh database."""

from __future__ import annotations

import threading

import pytest
from django.contrib.auth.models import User
from django.db import connection

from llmgw.bootstrap import first_start

pytestmark = pytest.mark.django_db(transaction=True)


def test_two_hosts_starting_together_create_one_operator(tmp_path):
    barrier = threading.Barrier(2)
    results, errors = [], []

    def start(n: int) -> None:
        folder = tmp_path / f"host{n}"
        folder.mkdir()
        try:
            barrier.wait()
            results.append(first_start(folder))
        except Exception as exc:  # noqa: BLE001 - the test reports whatever escaped
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=start, args=(n,)) for n in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert errors == []
    assert User.objects.filter(username="admin").count() == 1
    assert sorted(len(r.written) for r in results) == [0, 3]


def test_a_later_start_changes_nothing(tmp_path):
    assert len(first_start(tmp_path).written) == 3
    password = (tmp_path / "admin-password").read_text()
    assert first_start(tmp_path).written == []
    assert (tmp_path / "admin-password").read_text() == password
