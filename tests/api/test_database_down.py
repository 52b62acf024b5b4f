"""The admin listener while the database does not answer (a Patroni switchover or failover): 503, not 500."""

from __future__ import annotations

import pytest
from django.db import InterfaceError, OperationalError
from django.test import Client

from agentapi import views as agent_views
from api.views import fleet
from core.errors import DATABASE_RETRY_AFTER_S
from inventory.writes.heartbeats import desk
from tests.agentapi.agenthttp import asgi


def raises(error: Exception):
    def away(*args, **kwargs):
        raise error

    return away


def test_an_api_view_whose_database_is_away_answers_503_with_a_sentence(operator, monkeypatch):
    closed = OperationalError('connection to server at "127.0.0.1", port 5000 failed: server closed the connection')
    monkeypatch.setattr(fleet.SummaryView, "get", raises(closed))
    answer = operator.get("/api/v1/summary")
    assert answer.status_code == 503, answer.content
    assert answer["Retry-After"] == str(DATABASE_RETRY_AFTER_S)
    sentence = answer.json()["error"]
    assert sentence.startswith("the database did not answer (connection to server at")
    assert "failing over" in sentence and f"try again in {DATABASE_RETRY_AFTER_S} s" in sentence


@pytest.mark.django_db
def test_an_agent_registering_while_the_database_is_away_is_told_503(monkeypatch):
    monkeypatch.setattr(agent_views, "bearer", raises(InterfaceError("connection already closed")))
    answer = Client().post("/api/v1/agent/register", data=b"{}", content_type="application/json")
    assert answer.status_code == 503 and answer["Retry-After"] == str(DATABASE_RETRY_AFTER_S)
    assert "connection already closed" in answer.json()["error"]


def test_other_errors_are_not_taken_for_the_database(operator, monkeypatch):
    monkeypatch.setattr(fleet.SummaryView, "get", raises(ValueError("a bug")))
    with pytest.raises(ValueError):
        operator.get("/api/v1/summary")


@pytest.mark.django_db
def test_a_heartbeat_with_a_credential_not_yet_cached_while_the_database_is_away_is_told_503(monkeypatch):
    monkeypatch.setattr(desk, "lookup", raises(OperationalError("server closed the connection unexpectedly")))
    answer = asgi("/api/v1/agent/heartbeat", "not-cached-here", {})
    assert answer.status_code == 503 and answer.headers["Retry-After"] == str(DATABASE_RETRY_AFTER_S)
    assert "failing over" in answer.json()["error"], answer.json()


@pytest.mark.django_db
def test_a_request_that_waits_too_long_for_a_pooled_connection_is_told_503(operator, monkeypatch):
    """An admin process lends connections from a pool (core.dbpool); one that lends none in time is answered
    as a database that does not answer: psycopg_pool's own timeout, from a real pool whose only connection
    is held."""
    from django.db import connection
    from psycopg_pool import ConnectionPool

    params = {**connection.get_connection_params(), "autocommit": True}
    params.pop("cursor_factory", None)
    with ConnectionPool(kwargs=params, min_size=1, max_size=1, timeout=0.2, open=True) as pool, pool.connection():
        monkeypatch.setattr(fleet.SummaryView, "get", lambda *a, **k: pool.getconn())
        answer = operator.get("/api/v1/summary")
    assert answer.status_code == 503 and answer["Retry-After"] == str(DATABASE_RETRY_AFTER_S)
    assert "couldn't get a connection" in answer.json()["error"], answer.json()
