"""The admission decision, pure: which model a key may use, what a request reserves, and the refusal."""

from __future__ import annotations

from datetime import UTC, datetime

from gateway import rules
from gateway.rules import Ask, Caller

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def caller(models=None, budgets=(), key_rpm=None) -> Caller:
    return Caller("k1", 1, 1, models, key_rpm, None, None, None, budget_ids=budgets)


def ask(estimate: int | None = 10, db_limits: bool = True, requested: str = "chat") -> Ask:
    return Ask(requested, "llama", ("chat",), estimate, db_limits, NOW)


def test_a_model_the_key_may_not_use_is_refused_before_anything_is_counted_or_reserved():
    decision = rules.decide(caller(models=("other",), budgets=(1, 2), key_rpm=5), ask())
    refused = decision.refusal()
    assert refused.refused.status == 403 and "'chat'" in refused.refused.message
    assert not decision.count_limits and decision.reserve == ()


def test_a_model_is_allowed_by_its_name_or_an_alias_and_a_hop_by_its_catalog_name():
    assert rules.decide(caller(models=("llama",)), ask()).refusal() is None
    assert rules.decide(caller(models=("chat",)), ask(requested="llama")).refusal() is None
    assert rules.hop_allowed(caller(models=("llama",)), "llama", ())
    assert not rules.hop_allowed(caller(models=("chat",)), "mistral", ())


def test_a_priced_model_reserves_its_estimate_on_every_budget_over_the_key_and_an_unpriced_one_nothing():
    decision = rules.decide(caller(budgets=(3, 1)), ask(estimate=40))
    assert decision.admitted().reserved == ((3, 40), (1, 40))
    assert rules.decide(caller(budgets=(3, 1)), ask(estimate=None)).admitted().reserved == ()
    assert rules.decide(caller(), ask(estimate=40)).admitted().reserved == ()


def test_limits_are_counted_in_the_database_only_when_counted_there_and_set():
    assert rules.decide(caller(key_rpm=5), ask(db_limits=True)).count_limits
    assert not rules.decide(caller(key_rpm=5), ask(db_limits=False)).count_limits
    assert not rules.decide(caller(), ask(db_limits=True)).count_limits


def test_a_hop_moves_the_reservation_to_its_own_price():
    assert rules.adjustment(40, 100) == 60
    assert rules.adjustment(40, 10) == -30
    assert rules.adjustment(40, None) == -40
