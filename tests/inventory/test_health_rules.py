"""Severity of card health problems, from NVIDIA's Xid catalogue and memory-error documentation."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.discovery import gpus as G
from agent.discovery import nvidia_smi as smi
from inventory import health_rules as H
from inventory.health_rules import Kind, Problem, Severity
from tests.captures import read

A100_TEXT = (
    Path(__file__).resolve().parent.parent
    / "agent"
    / "captures"
    / ("nvidia-smi-q_a100-sxm4-80gb-x4_drv555.42.02_remap-pending.txt")
)
xids = st.integers(min_value=0, max_value=2**31 - 1)
problems = st.one_of(
    st.builds(Problem, st.just(Kind.XID), st.one_of(st.none(), xids), st.text(max_size=80)),
    st.builds(Problem, st.sampled_from([k for k in Kind if k is not Kind.XID])),
)


@given(problems)
@settings(max_examples=500)
def test_every_problem_gets_exactly_one_severity(problem):
    first = H.severity(problem)
    assert isinstance(first, Severity)
    assert H.severity(problem) is first  # a function of the problem alone


def test_every_kind_has_a_severity():
    assert set(H.KIND_SEVERITY) | {Kind.XID} == set(Kind)
    assert set(H.XID_BUCKETS.values()) - {"XID_154", "WORKFLOW_XID_45"} <= set(H.BUCKET_SEVERITY)


@given(xids.filter(lambda c: c not in H.XID_BUCKETS and c not in H.XID_OVERRIDES))
def test_an_xid_the_catalogue_does_not_list_gets_the_stated_default(code):
    assert H.xid_severity(code) is H.DEFAULT_XID_SEVERITY is Severity.WARNING


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        (48, Severity.FATAL),  # double-bit ECC
        (63, Severity.INFO),  # a row remapping recorded
        (64, Severity.FATAL),  # a row remapping failed: reset
        (74, Severity.FATAL),  # NVLink
        (79, Severity.FATAL),  # fallen off the bus
        (92, Severity.WARNING),  # high single-bit rate
        (94, Severity.WARNING),  # contained: reset when convenient
        (95, Severity.FATAL),  # uncontained
        (13, Severity.APPLICATION),  # the application's faults, not the card's
        (31, Severity.APPLICATION),
        (43, Severity.APPLICATION),
        (45, Severity.APPLICATION),
        (54, Severity.SERVICE),  # auxiliary power not connected
        (119, Severity.FATAL),  # GSP RPC timeout
        (140, Severity.FATAL),
    ],
)
def test_the_catalogue_categories(code, expected):
    assert H.xid_severity(code) is expected


def test_xid_154_is_as_grave_as_the_recovery_it_asks_for():
    said = "GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)"
    assert H.xid_severity(154, said) is Severity.FATAL
    assert H.xid_severity(154, "changed from 0x0 (None) to 0x5 (Drain P2P)") is Severity.WARNING
    assert H.xid_severity(154) is Severity.INFO


def test_fatal_means_out_of_service():
    assert [s for s in Severity if H.is_fatal(s)] == [Severity.FATAL, Severity.SERVICE]
    assert H.worst([]) is None
    assert H.worst([Problem(Kind.XID, 13), Problem(Kind.ROW_REMAP_FAILURE)]) is Severity.SERVICE


def entries(log: smi.SmiLog) -> list[dict]:
    return G.entries(G.cards_from_smi(log)[0])[0]


def test_a_pending_remap_warns_and_a_settled_one_is_no_problem():
    gpus = entries(smi.parse_text(A100_TEXT.read_text()))
    assert H.card_problems(gpus[1]) == [Problem(Kind.ROW_REMAP_PENDING)]
    assert H.worst(H.card_problems(gpus[1])) is Severity.WARNING
    assert H.card_problems(gpus[2]) == []  # one row remapped, nothing pending
    assert H.card_problems(gpus[0]) == []


def test_the_gravest_cards_of_the_captures():
    ecc = entries(smi.parse_xml(read("MOCK_nvidia-smi-q-x_gb200-profile_gpu0-ecc-dram-uncorrectable.xml")))
    assert set(H.card_problems(ecc[0])) == {
        Problem(Kind.ECC_VOLATILE_UNCORRECTABLE),
        Problem(Kind.ECC_AGGREGATE_UNCORRECTABLE),
        Problem(Kind.ROW_REMAP_FAILURE),
    }
    assert H.worst(H.card_problems(ecc[0])) is Severity.SERVICE
    lost = entries(smi.parse_xml(read("MOCK_nvidia-smi-q-x_gb200-profile_gpu1-lost.xml")))
    assert H.card_problems(lost[1]) == [Problem(Kind.GPU_LOST)]
    retired = entries(
        smi.parse_text(read("UPSTREAM-EDITED_nvidia-smi-q-d-PAGE_RETIREMENT_x8_retired-pages-nonzero.txt"))
    )
    assert H.card_problems(retired[0]) == [Problem(Kind.RETIRED_PAGES_AT_LIMIT)]
    assert H.card_problems(retired[1]) == [Problem(Kind.RETIRED_PAGES_PENDING)]
    healthy = entries(
        smi.parse_xml(read("nvidia-smi-q-x_gb200-x4_p6e-gb200_drv580.173.02_fabric-completed-healthy.xml"))
    )
    assert all(H.card_problems(e) == [] for e in healthy)


def test_xids_and_fabric_words_from_the_agent():
    card = {
        "health": ["Xid 79 (2 times) in the kernel log, last: GPU has fallen off the bus."],
        "fabric": {"problems": ["fabric health: Unhealthy", "fabric bandwidth degraded"]},
    }
    found = H.card_problems(card)
    assert found == [
        Problem(Kind.XID, 79, "GPU has fallen off the bus."),
        Problem(Kind.FABRIC_UNHEALTHY),
        Problem(Kind.FABRIC_DEGRADED_BANDWIDTH),
    ]
    assert [H.severity(p) for p in found] == [Severity.FATAL, Severity.FATAL, Severity.WARNING]


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=20,
)


@given(
    st.fixed_dictionaries(
        {},
        optional={
            "health": json_values,
            "fabric": json_values,
            "ecc": json_values,
            "remapped_rows": json_values,
            "retired_pages": json_values,
        },
    )
)
@settings(max_examples=300)
def test_any_card_shape_gives_problems_each_with_one_severity(card):
    found = H.card_problems(card)
    assert len(found) == len(set(found))
    assert all(isinstance(H.severity(p), Severity) for p in found)


counts = st.integers(min_value=0, max_value=2**40)
memory = st.fixed_dictionaries(
    {
        "ecc": st.fixed_dictionaries({"aggregate": st.dictionaries(st.sampled_from(G.ECC_COUNTERS), counts)}),
        "remapped_rows": st.dictionaries(st.sampled_from(["correctable", "uncorrectable"]), counts),
        "retired_pages": st.dictionaries(st.sampled_from(["single_bit", "double_bit"]), counts),
    }
)


@given(memory)
def test_the_same_counters_are_no_rise(card):
    assert H.rising(card, card) == []
    assert H.rising(card, None) == []


@given(memory, st.sampled_from(G.ECC_COUNTERS), st.integers(min_value=1, max_value=1000))
def test_a_higher_aggregate_ecc_count_is_a_rise_and_a_lower_one_is_not(before, counter, by):
    before["ecc"]["aggregate"].setdefault(counter, 0)
    after = {**before, "ecc": {"aggregate": {**before["ecc"]["aggregate"]}}}
    after["ecc"]["aggregate"][counter] += by
    found = H.rising(after, before)
    assert [p.kind for p in found] == [Kind.ECC_RISING]
    assert f"aggregate {counter} " in found[0].message
    assert H.rising(before, after) == []  # lower now: a reset or another card, no rise
    assert all(H.severity(p) is Severity.WARNING for p in found)


def test_remaps_and_retirements_rising():
    before = {"remapped_rows": {"correctable": 1, "uncorrectable": 0}, "retired_pages": {"single_bit": 2}}
    after = {"remapped_rows": {"correctable": 1, "uncorrectable": 2}, "retired_pages": {"single_bit": 3}}
    assert H.rising(after, before) == [
        Problem(Kind.ROW_REMAPS_RISING, message="uncorrectable 0 → 2"),
        Problem(Kind.RETIRED_PAGES_RISING, message="single_bit 2 → 3"),
    ]
