"""Reservations are held by living gateway processes: a dead one's are given back by the reaper, once."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db.models import Sum
from django.utils import timezone
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.models import ApiKey, Budget, Lease, LeaseHolder, Organisation, Team
from gateway.rules import Ask
from gateway.tasks import REAP_LEASES, reap_leases
from gateway.writes import budgets, keys, leases
from gateway.writes.usage import Finished, statements
from gateway.writes.usage import copy as usage_copy
from llmgw.celery import beat_schedule
from tests.gateway.test_pgpath import on_loop

NOW = timezone.now()
LEASE = timedelta(seconds=leases.lease_s())


def held(budget_id: int) -> int:
    return Lease.objects.filter(budget_id=budget_id).aggregate(s=Sum("micros"))["s"] or 0


def as_owner(monkeypatch, name: str) -> None:
    """Make this test process act as the gateway process ``name``."""
    monkeypatch.setattr(leases, "owner", lambda: name)


@pytest.fixture
def two_budgets(db):
    org = Organisation.objects.create(name="acme")
    team = Team.objects.create(name="search", org=org)
    key = ApiKey.objects.create(team=team, prefix="k", digest="d" * 64)
    return [
        Budget.objects.create(scope="team", team=team, amount_micros=10**9).id,
        Budget.objects.create(scope="key", key=key, amount_micros=10**9).id,
    ]


def test_a_reservation_and_its_settlement_move_the_budget_and_the_lease_together(two_budgets, monkeypatch):
    as_owner(monkeypatch, "gw-1")
    assert budgets.reserve(two_budgets, 70, NOW) is None
    lease = Lease.objects.get(budget_id=two_budgets[0])
    assert (lease.owner, lease.micros, lease.expires_at) == ("gw-1", 70, NOW + LEASE)
    assert [held(b) for b in two_budgets] == [70, 70]
    budgets.settle([(b, 70, 5) for b in two_budgets], NOW)
    assert list(Budget.objects.order_by("id").values_list("reserved_micros", "spent_micros")) == [(0, 5), (0, 5)]
    assert [held(b) for b in two_budgets] == [0, 0]


def test_the_reaper_gives_back_only_what_dead_processes_hold(two_budgets, monkeypatch):
    team_budget = two_budgets[0]
    for name, at in (("alive", NOW - 2 * LEASE), ("dead", NOW - 2 * LEASE), ("just-started", NOW)):
        as_owner(monkeypatch, name)
        assert budgets.reserve([team_budget], 100, at) is None
    # "alive" renews; "dead" stopped renewing a lease ago; "just-started" has not renewed yet.
    LeaseHolder.objects.create(owner="alive", expires_at=NOW + LEASE)
    LeaseHolder.objects.create(owner="dead", expires_at=NOW - timedelta(seconds=1))

    reaped = leases.reap(NOW)

    assert (reaped.leases, reaped.budgets, reaped.micros) == (1, 1, 100)
    assert sorted(Lease.objects.values_list("owner", flat=True)) == ["alive", "just-started"]
    assert Budget.objects.get(pk=team_budget).reserved_micros == 200
    assert not LeaseHolder.objects.filter(owner="dead").exists()
    assert leases.reap(NOW) == leases.Reaped(0, 0, 0)


def test_a_process_taken_for_dead_that_settles_later_gives_nothing_back_twice(two_budgets, monkeypatch):
    team_budget = two_budgets[0]
    as_owner(monkeypatch, "stalled")
    budgets.reserve([team_budget], 100, NOW - 2 * LEASE)
    leases.reap(NOW)
    assert Budget.objects.get(pk=team_budget).reserved_micros == 0
    as_owner(monkeypatch, "other")
    budgets.reserve([team_budget], 40, NOW)
    as_owner(monkeypatch, "stalled")
    budgets.settle([(team_budget, 100, 9)], NOW)
    budget = Budget.objects.get(pk=team_budget)
    assert (budget.reserved_micros, budget.spent_micros) == (40, 9)


def test_reservations_no_lease_covers_are_given_back(two_budgets):
    # Reserved before leases existed, by a process long gone.
    Budget.objects.filter(pk=two_budgets[1]).update(reserved_micros=5000)
    assert leases.reap(NOW).budgets == 1
    assert Budget.objects.get(pk=two_budgets[1]).reserved_micros == 0


def test_a_process_renews_its_leases_and_drops_the_empty_ones_when_it_stops(two_budgets, monkeypatch):
    as_owner(monkeypatch, "gw")
    budgets.reserve([two_budgets[0]], 10, NOW)
    budgets.reserve([two_budgets[1]], 10, NOW)
    budgets.settle([(two_budgets[1], 10, 0)], NOW)
    leases.renew(NOW)
    assert LeaseHolder.objects.get().expires_at == NOW + LEASE
    leases.release(NOW)
    assert list(Lease.objects.values_list("budget_id", "micros")) == [(two_budgets[0], 10)]
    assert LeaseHolder.objects.exists()  # something is still held: the holder stays until it is settled
    budgets.settle([(two_budgets[0], 10, 0)], NOW)
    leases.release(NOW)
    assert not Lease.objects.exists() and not LeaseHolder.objects.exists()


OWNERS = ["a", "b", "c"]
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("reserve"), st.sampled_from(OWNERS), st.integers(0, 1), st.integers(1, 500)),
        st.tuples(st.just("settle"), st.sampled_from(OWNERS), st.integers(0, 1), st.integers(0, 50)),
        st.tuples(st.just("die"), st.sampled_from(OWNERS)),
        st.tuples(
            st.just("reap"),
        ),
    ),
    max_size=25,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(OPS)
def test_whatever_processes_do_a_budget_holds_what_the_living_hold(two_budgets, monkeypatch, ops):
    """For any run of reservations, settlements, deaths and reaps: reserved = what processes not reaped hold."""
    Lease.objects.all().delete()
    LeaseHolder.objects.all().delete()
    Budget.objects.update(reserved_micros=0, spent_micros=0)
    outstanding: dict[str, list[tuple[int, int]]] = {o: [] for o in OWNERS}
    dead: set[str] = set()
    reaped: set[str] = set()
    for op in ops:
        if op[0] == "reserve" and op[1] not in dead:
            _, owner, which, micros = op
            as_owner(monkeypatch, owner)
            LeaseHolder.objects.update_or_create(owner=owner, defaults={"expires_at": NOW + LEASE})
            assert budgets.reserve([two_budgets[which]], micros, NOW) is None
            outstanding[owner].append((two_budgets[which], micros))
        elif op[0] == "settle" and outstanding[op[1]]:
            _, owner, _, cost = op
            as_owner(monkeypatch, owner)
            budget_id, micros = outstanding[owner].pop(0)
            budgets.settle([(budget_id, micros, cost)], NOW)
        elif op[0] == "die":
            dead.add(op[1])
            LeaseHolder.objects.filter(owner=op[1]).update(expires_at=NOW - timedelta(seconds=1))
            Lease.objects.filter(owner=op[1]).update(expires_at=NOW - timedelta(seconds=1))
        elif op[0] == "reap":
            leases.reap(NOW)
            reaped |= dead
        for budget_id in two_budgets:
            expected = sum(m for o in OWNERS if o not in reaped for b, m in outstanding[o] if b == budget_id)
            assert Budget.objects.get(pk=budget_id).reserved_micros == expected == held(budget_id)


# --- the loop's path (PostgreSQL) -----------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_the_loops_admission_holds_a_lease_for_every_budget_it_reserves_and_the_loops_writer_ends_it():
    one = keys.issue(team="one", org="acme")
    several = keys.issue(team="several", org="acme")
    Budget.objects.create(scope="key", key=one.key, amount_micros=10**6)
    Budget.objects.create(scope="key", key=several.key, amount_micros=10**6)
    Budget.objects.create(scope="team", team=several.key.team, amount_micros=10**6)
    now = timezone.now()

    async def scenario(pg):
        admitted = [await pg.admit(k.secret, Ask("m", "m", (), 30, True, now)) for k in (one, several)]
        holding = await pg.run_db(lambda: sorted(Lease.objects.values_list("micros", flat=True)))
        batch = [
            Finished(
                now,
                a.caller,
                "m",
                "m",
                "r",
                "chat/completions",
                False,
                1,
                1,
                "engine",
                2,
                200,
                "ok",
                1.0,
                None,
                a.reserved,
            )
            for a in admitted
        ]
        await pg.write(statements(batch, timezone.now(), records=False), copy=usage_copy(batch))
        return admitted, holding

    admitted, holding = on_loop(scenario)
    assert [len(a.reserved) for a in admitted] == [1, 2] and holding == [30, 30, 30]
    assert set(Lease.objects.values_list("owner", "micros")) == {(leases.owner(), 0)}
    assert list(Budget.objects.values_list("reserved_micros", "spent_micros")) == [(0, 2)] * 3


# --- the periodic task ------------------------------------------------------------------


def test_the_reaper_runs_from_beat_under_a_lock_of_its_own(two_budgets):
    entry = beat_schedule({})["reap_leases"]
    assert entry["task"] == REAP_LEASES and entry["schedule"] == 60.0
    assert entry["options"]["expires"] < entry["schedule"]
    Budget.objects.filter(pk=two_budgets[0]).update(reserved_micros=7)
    assert reap_leases() == {"leases": 0, "budgets": 1, "micros": 7}


def test_clearing_reservations_by_hand_ends_their_leases_too(two_budgets, admin_client, monkeypatch):
    as_owner(monkeypatch, "gw")
    budgets.reserve(two_budgets, 10, NOW)
    answer = admin_client.post(
        "/admin/gateway/budget/", {"action": "clear_reservations", "_selected_action": two_budgets}
    )
    assert answer.status_code == 302
    assert list(Budget.objects.values_list("reserved_micros", flat=True)) == [0, 0]
    # Nothing for the reaper to hold again, nothing for a late settlement to give back twice.
    assert not Lease.objects.exists() and leases.reap(NOW) == leases.Reaped(0, 0, 0)
    budgets.settle([(b, 10, 1) for b in two_budgets], NOW)
    assert list(Budget.objects.values_list("reserved_micros", "spent_micros")) == [(0, 1), (0, 1)]
