"""The NVLink fabric rules (agent.nvlink_rules), over the raw values nvidia-smi and NVML report.

Two kinds of property:

- equivalent spellings get equal answers: case, surrounding and repeated
  whitespace, ``_`` for a space, a bracketed ``[N/A]``, an upper-case UUID;
- the five places that used to decide for themselves (ingestion, the NVLink
  report, the scheduler's room, the sweeps, ``/metrics``) keep their answers
  for what today's agents send, except where they were wrong — each such case
  is a test of its own below, saying which answer is right.

The old rules are copied here verbatim from before they moved (commit c7e27c0), as the oracle.
"""

from __future__ import annotations

import uuid as uuidlib

from hypothesis import given
from hypothesis import strategies as st

from agent import nvlink_rules as R
from agent.nvlink_rules import DomainKey

ZERO = "00000000-0000-0000-0000-000000000000"
# What the agent reports (agent.discovery.gpus: states title-cased, UUIDs lower-cased, N/A as Not Supported).
AGENT_STATES = ["Not Supported", "Not Started", "In Progress", "Completed", ""]
STATUSES = ["Success", "Insufficient Resources", "Failure", "N/A", ""]
# Every spelling the fixtures show for "no fabric": nvidia-smi's N/A, NVML's Not Supported, nothing reported.
NO_FABRIC = ["", "N/A", "[N/A]", "Not Supported", "not_supported", "NOT SUPPORTED"]


# --- the old rules, verbatim ------------------------------------------------------------------------------------


def old_is_zero_uuid(value: str) -> bool:  # inventory/writes/ingest.py
    return not value.replace("0", "").replace("-", "").strip()


def old_ingest_joined(fabric: dict | None) -> tuple[str, int] | None:  # inventory/writes/ingest.py
    if not fabric:
        return None
    uuid = (fabric.get("cluster_uuid") or "").strip()
    if fabric.get("state") != "Completed" or fabric.get("status") != "Success" or not uuid or old_is_zero_uuid(uuid):
        return None
    clique = fabric.get("clique_id")
    return (uuid.lower(), int(clique) if clique is not None else 0)


def old_metrics_claimed(uuid: str, clique: int | None) -> str:  # observability/metrics.py, also the sweeps'
    return "" if not uuid or old_is_zero_uuid(uuid) else f"{uuid}/{clique or 0}"


def old_in_nvlink_metrics(fabric_state: str, fabric_status: str, claimed: str, joined: bool) -> bool:
    if fabric_state in ("", "Not Supported"):
        return False
    settled = fabric_state == "Completed" and fabric_status.lower() == "success"
    return joined or bool(claimed) or not settled


def old_sweeps_has_fabric(state: str) -> bool:  # observability/sweeps.py
    return state not in ("", "Not Supported")


_OLD_NO_FABRIC_STATES = frozenset({"", "n/a", "not supported", "not_supported"})


def old_nvlink_trying(state: str) -> bool:  # inventory/reads/nvlink.py
    state = (state or "").strip().lower()
    return state not in _OLD_NO_FABRIC_STATES and state != "completed"


def old_nvlink_claimed(uuid: str, clique: int | None) -> tuple[str, int] | None:  # the lookup key it built
    uuid = (uuid or "").strip().lower()
    if not uuid or old_is_zero_uuid(uuid) or clique is None:
        return None
    return (uuid, clique)


def old_room_joined(state: str, status: str) -> bool:  # placement/scheduling/room.py
    return state.strip().lower() == "completed" and status.strip().lower() == "success"


def old_room_has_fabric(state: str) -> bool:
    return state.strip().lower() not in _OLD_NO_FABRIC_STATES


def old_room_trying(state: str) -> bool:
    return state.strip().lower() not in _OLD_NO_FABRIC_STATES | {"completed"}


# --- strategies ---------------------------------------------------------------------------------------------------


@st.composite
def respelled(draw, word: str) -> str:
    """``word`` as another tool or driver might print it: any case, padded, spaces doubled or as ``_``."""
    cased = "".join(c.upper() if draw(st.booleans()) else c.lower() for c in word)
    gap = draw(st.sampled_from([" ", "  ", "_", "\t"]))
    pad = st.sampled_from(["", " ", "  ", "\t", "\n"])
    return draw(pad) + gap.join(cased.split(" ")) + draw(pad)


@st.composite
def respelled_uuid(draw, value: str) -> str:
    cased = value.upper() if draw(st.booleans()) else value
    pad = st.sampled_from(["", " ", "\t", "\n "])
    return draw(pad) + cased + draw(pad)


uuids = st.uuids().map(str)
cliques = st.one_of(st.none(), st.integers(min_value=0, max_value=2**31))
states = st.sampled_from([*AGENT_STATES, "N/A"])
statuses = st.sampled_from(STATUSES)
claimed_uuids = st.one_of(uuids, st.sampled_from([ZERO, "0" * 32, "", "N/A"]))


# --- equivalent spellings -----------------------------------------------------------------------------------------


@given(st.data(), states, statuses, claimed_uuids, cliques)
def test_equivalent_spellings_get_equal_answers(data, state, status, uuid, clique):
    state2 = data.draw(respelled(state))
    status2 = data.draw(respelled(status))
    uuid2 = data.draw(respelled_uuid(uuid))
    assert R.has_fabric(state2) == R.has_fabric(state)
    assert R.completed(state2) == R.completed(state)
    assert R.registered(state2, status2) == R.registered(state, status)
    assert R.trying(state2, status2) == R.trying(state, status)
    assert R.claimed_key(uuid2, clique) == R.claimed_key(uuid, clique)
    assert R.claimed_text(uuid2, clique) == R.claimed_text(uuid, clique)
    assert R.joined_key(state2, status2, uuid2, clique) == R.joined_key(state, status, uuid, clique)
    assert R.expects_domain(state2, status2, uuid2, clique) == R.expects_domain(state, status, uuid, clique)


@given(st.sampled_from(NO_FABRIC).flatmap(respelled), statuses, claimed_uuids, cliques)
def test_every_spelling_of_no_fabric_is_no_fabric(state, status, uuid, clique):
    assert not R.has_fabric(state)
    assert not R.trying(state, status) and not R.expects_domain(state, status, uuid, clique)


@given(st.sampled_from([ZERO, "0" * 32, "00000000-0000-0000-0000-00000000", "", "N/A", "[N/A]", "None"]), cliques)
def test_zero_and_missing_uuids_name_no_domain(uuid, clique):
    assert R.claimed_key(uuid, clique) is None and R.claimed_text(uuid, clique) == ""
    assert R.joined_key("Completed", "Success", uuid, clique) is None


@given(uuids, st.integers(min_value=0, max_value=2**31))
def test_a_domain_is_named_by_its_lower_case_uuid_and_clique(uuid, clique):
    key = R.claimed_key(uuid.upper(), clique)
    assert key == DomainKey(uuid.lower(), clique) and key.text == f"{uuid.lower()}/{clique}"


# --- the old callers keep their answers for what the agent sends ------------------------------------------------


@given(st.sampled_from(AGENT_STATES), statuses, st.one_of(uuids, st.sampled_from([ZERO, ""])), cliques)
def test_the_old_rules_answers_are_kept_where_they_were_right(state, status, uuid, clique):
    fabric = {"state": state, "status": status, "cluster_uuid": uuid, "clique_id": clique}
    joined = R.joined_key(state, status, uuid, clique)
    # Ingestion: which domain a card joins.
    assert joined == old_ingest_joined(fabric)
    # /metrics and the sweeps: the domain a card names, and whether it has a place in llmgw_gpu_nvlink_joined.
    assert R.claimed_text(uuid, clique) == old_metrics_claimed(uuid, clique)
    claimed = old_metrics_claimed(uuid, clique)
    assert (joined is not None or R.expects_domain(state, status, uuid, clique)) == old_in_nvlink_metrics(
        state, status, claimed, joined is not None
    )
    assert R.has_fabric(state) == old_sweeps_has_fabric(state) == old_room_has_fabric(state)
    # The scheduler's room: registered; and "trying" where registration is not Completed.
    assert R.registered(state, status) == old_room_joined(state, status)
    if state != "Completed":
        assert R.trying(state, status) == old_room_trying(state) == old_nvlink_trying(state)
    # The NVLink report's lookup of the domain a card names, where it reported a CliqueId.
    if clique is not None:
        assert R.claimed_key(uuid, clique) == old_nvlink_claimed(uuid, clique)


# --- where the old places disagreed --------------------------------------------------------------------------------


def test_a_failed_registration_is_trying_as_metrics_said_not_settled_as_the_report_and_room_said():
    """Azure's capture (FRAGMENT_nvidia-smi-q_fabric_insufficient-resources): Completed, an NVML error, zero UUID.

    The NVLink report and the room counted only "not Completed" as trying, so
    such a node was dropped from the report and never explained; /metrics had
    it as not joined. It has a fabric and has not joined: trying.
    """
    state, status, uuid, clique = "Completed", "Insufficient Resources", ZERO, 0
    assert R.trying(state, status) and R.expects_domain(state, status, uuid, clique)
    assert old_in_nvlink_metrics(state, status, old_metrics_claimed(uuid, clique), False)
    assert not old_nvlink_trying(state) and not old_room_trying(state)


def test_an_hgx_box_on_its_own_nvswitch_has_a_fabric_but_no_domain_and_is_not_trying():
    """The HGX H100 and H200 captures: Completed, Success, CliqueId 0, all-zero ClusterUUID."""
    args = ("Completed", "Success", ZERO, 0)
    assert R.has_fabric(args[0]) and R.registered(*args[:2]) and not R.trying(*args[:2])
    assert R.joined_key(*args) is None and not R.expects_domain(*args)


def test_the_gb200_capture_joins_its_domain():
    """The p6e-gb200 capture: Completed, Success, CliqueId 2, ClusterUUID 00000001-…-000000000001."""
    uuid = "00000001-0000-0000-0000-000000000001"
    assert R.joined_key("Completed", "Success", uuid, 2) == DomainKey(uuid, 2)


def test_n_a_is_no_fabric_where_metrics_and_sweeps_had_it_as_a_fabric():
    """nvidia-smi prints N/A (the A100 MIG, RTX 3080, Titan V captures); /metrics and the sweeps compared exactly."""
    assert not R.has_fabric("N/A")
    assert old_sweeps_has_fabric("N/A") and old_in_nvlink_metrics("N/A", "N/A", "", False)
    assert not old_room_has_fabric("N/A")


def test_a_missing_clique_id_names_clique_0_as_ingestion_keys_it_not_nothing_as_the_report_had_it():
    """Ingestion keys a joined card with no CliqueId as clique 0; the report could then not find that domain."""
    uuid = str(uuidlib.UUID(int=7))
    assert R.claimed_key(uuid, None) == R.joined_key("Completed", "Success", uuid, None) == DomainKey(uuid, 0)
    assert old_ingest_joined({"state": "Completed", "status": "Success", "cluster_uuid": uuid}) == (uuid, 0)
    assert old_nvlink_claimed(uuid, None) is None


def test_case_and_padding_no_longer_keep_a_card_out_of_its_domain():
    """Ingestion compared "Completed"/"Success" exactly, and /metrics and the sweeps kept the UUID's case."""
    uuid = "DC6E40C4-D722-4357-9BA6-5291DD461278"
    assert R.joined_key(" completed ", "SUCCESS", uuid, 2) == DomainKey(uuid.lower(), 2)
    assert (
        old_ingest_joined({"state": " completed ", "status": "SUCCESS", "cluster_uuid": uuid, "clique_id": 2}) is None
    )
    assert old_metrics_claimed(uuid, 2) != f"{uuid.lower()}/2"


@given(st.integers(min_value=0, max_value=2**31 - 1))
def test_a_card_settled_alone_claims_no_domain_and_is_not_trying(clique):
    """What lets the NVLink report leave out a node whose cards are all SETTLED_ALONE before reading them."""
    state, status, uuid = R.SETTLED_ALONE
    assert R.claimed_key(uuid, clique) is None
    assert R.has_fabric(state) and not R.trying(state, status)
