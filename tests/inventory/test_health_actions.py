"""The card health actions (hold, cordon, and their undoing), as a pure function: properties and cases."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from inventory import health_actions as A
from inventory.health_rules import Kind, Problem, Severity

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
S = A.Settings(window_s=600, cordon_after=3, clean_s=3600)

severities = st.sampled_from(list(Severity))
quiet = st.sampled_from([Severity.INFO, Severity.APPLICATION])
ages = st.floats(min_value=0, max_value=7200, allow_nan=False)
gpus = st.integers(min_value=0, max_value=7)


def event(age: float, gpu: int, severity: Severity, what: str = "Xid") -> A.Event:
    return A.Event(at=NOW - timedelta(seconds=age), gpu=gpu, severity=severity, what=what)


events = st.lists(st.builds(event, ages, gpus, severities), max_size=20)
quiet_events = st.lists(st.builds(event, ages, gpus, quiet), max_size=20)
showing = st.dictionaries(gpus, st.one_of(st.none(), severities), max_size=8)
config = st.builds(
    A.Settings,
    window_s=st.floats(min_value=1, max_value=3600),
    cordon_after=st.integers(min_value=1, max_value=10),
    clean_s=st.floats(min_value=1, max_value=7200),
)


@given(quiet_events, st.dictionaries(gpus, st.one_of(st.none(), quiet)), st.booleans(), config)
@settings(max_examples=300)
def test_info_and_application_problems_never_act(evs, shown, cordoned, cfg):
    d = A.decide(evs, shown, held=(), health_cordoned=False, now=NOW, settings=cfg)
    assert not d.hold and d.cordon is None


@given(events, showing, st.sets(gpus), st.booleans(), config)
@settings(max_examples=500)
def test_nothing_is_undone_before_a_clean_window(evs, shown, held, cordoned, cfg):
    d = A.decide(evs, shown, held, cordoned, NOW, cfg)
    start = NOW - timedelta(seconds=cfg.clean_s)
    for gpu in d.release:
        assert gpu in held
        assert not any(e.gpu == gpu and A.counts(e.severity) and e.at > start for e in evs)
        assert not (shown.get(gpu) is not None and shown[gpu] >= Severity.FATAL)
    if d.uncordon:
        assert cordoned
        assert not any(A.counts(e.severity) and e.at > start for e in evs)


@given(events, showing, st.sets(gpus), config)
@settings(max_examples=500)
def test_cordons_only_after_n_counted_problems_within_the_window(evs, shown, held, cfg):
    d = A.decide(evs, shown, held, False, NOW, cfg)
    start = NOW - timedelta(seconds=cfg.window_s)
    recent = [e for e in evs if A.counts(e.severity) and e.at > start]
    assert (d.cordon is not None) == (len(recent) >= cfg.cordon_after)


@given(events, showing, st.sets(gpus), config)
@settings(max_examples=300)
def test_a_card_is_held_only_for_a_fatal_problem_and_never_held_and_released_at_once(evs, shown, held, cfg):
    d = A.decide(evs, shown, held, False, NOW, cfg)
    assert not set(d.hold) & set(d.release)
    assert not set(d.hold) & held
    start = NOW - timedelta(seconds=cfg.clean_s)
    for gpu in d.hold:
        now_fatal = shown.get(gpu) is not None and shown[gpu] >= Severity.FATAL
        assert now_fatal or any(e.gpu == gpu and e.severity >= Severity.FATAL and e.at > start for e in evs)


def test_a_fatal_xid_holds_the_card_with_its_words():
    d = A.decide([event(5, 3, Severity.FATAL, "Xid 79")], {3: Severity.FATAL}, (), False, NOW, S)
    assert d.hold == {3: "Xid 79"} and d.cordon is None


def test_warnings_alone_hold_nothing_but_three_in_ten_minutes_cordon():
    evs = [event(500, 1, Severity.WARNING, "Xid 92"), event(200, 2, Severity.WARNING, "Xid 92")]
    assert not A.decide(evs, {}, (), False, NOW, S).acts
    evs.append(event(10, 1, Severity.WARNING, "Xid 92"))
    d = A.decide(evs, {}, (), False, NOW, S)
    assert not d.hold
    assert d.cordon.startswith("3 card health problems within 600 s")
    assert "gpu 2: Xid 92" in d.cordon
    # Already cordoned by health: not cordoned again.
    assert A.decide(evs, {}, (), True, NOW, S).cordon is None


def test_a_recovered_card_stays_held_until_clean_for_the_window():
    evs = [event(3000, 0, Severity.FATAL, "Xid 48")]
    assert A.decide(evs, {0: None}, {0}, False, NOW, S).release == ()
    evs = [event(3700, 0, Severity.FATAL, "Xid 48")]
    assert A.decide(evs, {0: None}, {0}, False, NOW, S).release == (0,)
    # Still showing a fatal problem (the card was not reset): kept however old the event.
    assert A.decide(evs, {0: Severity.FATAL}, {0}, False, NOW, S).release == ()


def test_a_health_cordon_is_lifted_after_a_clean_window_only():
    evs = [event(4000, 1, Severity.WARNING), event(3500, 1, Severity.WARNING)]
    assert not A.decide(evs, {}, (), True, NOW, S).uncordon
    evs = [event(4000, 1, Severity.WARNING)]
    assert A.decide(evs, {}, (), True, NOW, S).uncordon


def test_fabric_problems_are_left_to_the_nvlink_domain():
    assert not A.card_local(Problem(Kind.FABRIC_NOT_REGISTERED))
    assert not A.card_local(Problem(Kind.FABRIC_UNHEALTHY))
    assert A.card_local(Problem(Kind.XID, 79)) and A.card_local(Problem(Kind.ECC_VOLATILE_UNCORRECTABLE))
    assert {k for k in Kind if k.value.startswith("fabric") or "fabric" in k.value} == A.FABRIC_KINDS
