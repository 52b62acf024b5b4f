"""A node that sends full report after full report, each with new Xids: what it may make the control plane store.

Measured before: 100 reports carrying 32 new Xids a card wrote 25,600 health events
in 52 s. Two bounds now hold, each on its own:

- a node's full reports are taken at most once every ``LLMGW_REPORT_MIN_INTERVAL_S``;
  one sooner is answered 429 with ``Retry-After``, which the agent honours (its report
  is sent again then: tests/agent/test_loop.py);
- whatever the rate, a card keeps at most ``LLMGW_HEALTH_EVENTS_PER_CARD`` events one by
  one within the look-back, and folds the rest into one summary event as grave as the
  gravest it folds.

On PostgreSQL, through the ASGI application ``llmgw serve`` runs (the report's fast lane,
then the view).
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone
from hypothesis import given, settings
from hypothesis import strategies as st

from inventory import health_actions as A
from inventory.health_rules import Severity
from inventory.models import CardHealthEvent, CardHold, Node
from inventory.writes.health import SUMMARY
from llmgw.bootstrap import issue_join_token
from tests.agentapi import agenthttp
from tests.agentapi.reports import report

pytestmark = pytest.mark.django_db(transaction=True)
REPORT = "/api/v1/agent/report"
CARDS = 4  # tests.agentapi.reports.report()'s


def _register() -> str:
    from django.test import Client

    answer = agenthttp.register(Client(), issue_join_token(), report=report())
    assert answer.status_code == 201, answer.content
    return answer.json()["credential"]


def _storm(round_: int, code: int = 31, per_card: int = 32) -> dict:
    """A report whose every card lists ``per_card`` Xids not listed before (as the agent lists its recent ones)."""
    body = report()
    base = time.time() - 1000 + round_ * 32
    for card in body["gpus"]:
        card["xids"] = [{"code": code, "at": base + i, "message": f"storm {round_}.{i}"} for i in range(per_card)]
    return body


def _back_in_time(seconds: float) -> None:
    """As if the node's last report came ``seconds`` ago."""
    Node.objects.update(last_report_at=timezone.now() - timedelta(seconds=seconds))


def test_a_report_sooner_than_the_interval_is_answered_429_with_retry_after_and_stores_nothing(monkeypatch):
    monkeypatch.setenv("LLMGW_REPORT_MIN_INTERVAL_S", "30")
    secret = _register()
    before = agenthttp.snapshot()

    refused = agenthttp.asgi(REPORT, secret, _storm(0))  # the registration carried a report a moment ago

    assert refused.status_code == 429, refused.content
    assert 1 <= int(refused.headers["retry-after"]) <= 30
    assert "at most every 30 s" in refused.json()["error"]
    assert agenthttp.snapshot() == before and not CardHealthEvent.objects.exists()
    _back_in_time(31)
    assert agenthttp.asgi(REPORT, secret, _storm(0)).status_code == 200
    assert CardHealthEvent.objects.count() == CARDS * 32


def test_of_reports_sent_at_once_one_is_taken(monkeypatch):
    monkeypatch.setenv("LLMGW_REPORT_MIN_INTERVAL_S", "30")
    secret = _register()
    _back_in_time(31)
    statuses: list[int] = []
    start = threading.Barrier(12)

    def send(round_: int) -> None:
        try:
            start.wait(10)
            statuses.append(agenthttp.asgi(REPORT, secret, _storm(round_)).status_code)
        finally:
            connection.close()

    threads = [threading.Thread(target=send, args=(i,)) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)

    assert sorted(statuses) == [200] + [429] * 11
    assert CardHealthEvent.objects.count() == CARDS * 32


def test_a_storm_of_reports_keeps_each_card_to_its_cap_and_folds_the_rest_with_the_gravest(monkeypatch):
    monkeypatch.setenv("LLMGW_HEALTH_EVENTS_PER_CARD", "40")
    secret = _register()
    rounds = 6
    for r in range(rounds):
        assert agenthttp.asgi(REPORT, secret, _storm(r)).status_code == 200
    # A fatal Xid once every card is full, then the same report again (the agent lists its recent Xids each time).
    fatal = _storm(rounds, code=79, per_card=1)
    assert agenthttp.asgi(REPORT, secret, fatal).status_code == 200
    assert agenthttp.asgi(REPORT, secret, fatal).status_code == 200

    for card in range(CARDS):
        rows = CardHealthEvent.objects.filter(gpu_index=card)
        (summary,) = rows.filter(what__startswith=SUMMARY)
        assert rows.count() == 40 + 1
        # Every Xid the card listed is stored or counted in its summary, once.
        assert summary.what.startswith(f"{SUMMARY}{rounds * 32 + 1 - 40} more problems")
        assert summary.severity == Severity.FATAL and "Xid 79" in summary.what
    # The fatal Xid folded into the summary still holds the cards.
    assert sorted(CardHold.objects.values_list("gpu_index", flat=True)) == list(range(CARDS))


@settings(max_examples=300)
@given(
    new=st.lists(st.tuples(st.integers(0, 3), st.sampled_from(list(Severity)), st.integers(0, 50)), max_size=40).map(
        lambda rows: [
            A.Event(at=timezone.now() + timedelta(seconds=s), gpu=g, severity=v, what=f"{i}")
            for i, (g, v, s) in enumerate(rows)
        ]
    ),
    stored=st.dictionaries(st.integers(0, 3), st.integers(0, 12)),
    cap=st.integers(1, 10),
)
@pytest.mark.django_db(transaction=False)
def test_over_cap_keeps_each_card_within_its_room_and_the_gravest_first(new, stored, cap):
    kept, folded = A.over_cap(new, stored, cap)
    assert sorted(kept + [i for positions in folded.values() for i in positions]) == list(range(len(new)))
    for gpu in {e.gpu for e in new}:
        mine = [i for i in kept if new[i].gpu == gpu]
        assert len(mine) == min(max(0, cap - stored.get(gpu, 0)), sum(e.gpu == gpu for e in new))
        if folded.get(gpu):
            assert min(new[i].severity for i in mine or [folded[gpu][0]]) >= max(new[i].severity for i in folded[gpu])
