"""Mangled captures thrown at every parser: a result or a DiscoveryError, never another exception.

Each example mangles a real capture (cut short, bytes flipped, an element or
lines deleted) and runs it through the parser and, where it parses, on through
the whole GPU pipeline and the NVML fake, because a parser that returns odd
values must not make the next stage crash either.
"""

from __future__ import annotations

import contextlib
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.discovery import fabric_facts
from agent.discovery import gpus as G
from agent.discovery import nvidia_smi as smi
from agent.discovery import nvml as N
from agent.discovery import xids as xid_log
from agent.discovery.errors import DiscoveryError
from agent.discovery.nvml_fake import FakeNvml
from agent.discovery.topo import parse_topo
from tests.captures import read

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

XML_SEEDS = [
    read("nvidia-smi-q-x_a100-sxm4-80gb_mig-enabled_drv535.54.03.xml"),
    read("MOCK_nvidia-smi-q-x_gb200-profile_gpu1-lost.xml"),
    read("nvidia-smi-q-x_tesla-t4_drv515.105.01.xml"),
]
TEXT_SEEDS = [
    read("nvidia-smi-q_h200-single_drv550.90.12_fabric-completed.txt"),
    read("nvidia-smi-q_a10-single_drv535.129.03.txt"),
    read("UPSTREAM-EDITED_nvidia-smi-q-d-PAGE_RETIREMENT_x8_retired-pages-nonzero.txt"),
]
LIST_SEED = read("nvidia-smi-L_gh200-96gb-x2_mig-7x1g.12gb_yaml-comment.txt")
TOPO_SEED = read("nvidia-smi-topo-m_h100-x8_8nics-mlx5_sglang-issue.txt")
FRAGMENT_SEED = read("FRAGMENT_nvidia-smi-q_grep-fabric_gb200_unhealthy-summary.txt")

_ELEMENT = re.compile(r"<(\w+)>[^<]*</\1>")


@st.composite
def mangled(draw, seeds: list[str]) -> str:
    text = draw(st.sampled_from(seeds))
    data = bytearray(text.encode())
    kind = draw(st.sampled_from(["truncate", "flip", "delete_element", "delete_lines", "mixed"]))
    if kind in ("truncate", "mixed"):
        data = data[: draw(st.integers(0, len(data)))]
    if kind in ("flip", "mixed"):
        for _ in range(draw(st.integers(1, 12))):
            if data:
                data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
    text = data.decode(errors="replace")
    if kind == "delete_element":
        spans = [m.span() for m in _ELEMENT.finditer(text)]
        for _ in range(draw(st.integers(1, 8))):
            if spans:
                start, end = spans.pop(draw(st.integers(0, len(spans) - 1)))
                text = text[:start] + " " * (end - start) + text[end:]
    if kind == "delete_lines":
        lines = text.splitlines(keepends=True)
        for _ in range(draw(st.integers(1, 10))):
            if lines:
                lines.pop(draw(st.integers(0, len(lines) - 1)))
        text = "".join(lines)
    return text


def _pipeline(log: smi.SmiLog) -> None:
    cards, _ = G.cards_from_smi(log)
    G.entries(cards)
    reading = N.read_cards(FakeNvml(log))
    G.entries(reading.cards)


@SETTINGS
@given(mangled(XML_SEEDS))
def test_xml_parser_and_pipeline(text):
    try:
        log = smi.parse_xml(text)
    except DiscoveryError:
        return
    _pipeline(log)


@SETTINGS
@given(mangled(TEXT_SEEDS))
def test_text_parser_and_pipeline(text):
    try:
        log = smi.parse_text(text)
    except DiscoveryError:
        return
    _pipeline(log)


@SETTINGS
@given(mangled([LIST_SEED]))
def test_list_parser(text):
    try:
        listing = smi.parse_list(text)
    except DiscoveryError:
        return
    G.entries(G.cards_from_listing(listing))


@SETTINGS
@given(mangled([TOPO_SEED]))
def test_topo_parser(text):
    try:
        topo = parse_topo(text)
    except DiscoveryError:
        return
    cards, _ = G.cards_from_smi(smi.parse_xml(XML_SEEDS[0]))
    G.apply_topology(cards, topo)


@SETTINGS
@given(mangled([FRAGMENT_SEED]))
def test_fabric_fragment_parser(text):
    try:
        raw = smi.parse_fabric_block(text)
    except DiscoveryError:
        return
    facts = fabric_facts.fabric_from_smi(raw)
    if facts is not None:
        fabric_facts.joined_domain(fabric_facts.fabric_report(facts))


@SETTINGS
@given(st.text(max_size=400))
def test_arbitrary_text_everywhere(text):
    for parse in (smi.parse_xml, smi.parse_text, smi.parse_list, parse_topo, smi.parse_fabric_block):
        with contextlib.suppress(DiscoveryError):
            parse(text)
    xid_log.apply_xids([], xid_log.parse_xid_log(text))


@pytest.mark.parametrize("raw", ["9" * 400 + " MiB", "[N/A]", "GPU is lost", "Unknown Error", ""])
def test_values_that_are_no_number_are_unknown(raw):
    assert smi.integer(raw) is None
    assert smi.number(raw) is None
