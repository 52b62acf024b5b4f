"""The rack drawing: the renderer's states and geometry, and the template's attributes, from a real fleet's data."""

from __future__ import annotations

import itertools
import re

import pytest
from django.template.loader import render_to_string

from agent.simulator import fleet as F
from dashboard.racks import DEGRADED, DOWN, JOINED, RackRenderer, compress_reasons, short_names
from inventory.models import Node
from inventory.reads import nvlink_report
from tests.api.fleet import ingest, ingest_fleet


def rack_of(report: dict, index: int = 0):
    return RackRenderer(report["domains"][index]).render()


def chips(rack) -> dict[str, str]:
    return {c.gpu: c.state for t in rack.trays for c in t.chips}


@pytest.fixture
def nvl72(db) -> dict[str, F.SimNode]:
    return {s.name: s for s in ingest_fleet("gb200-nvl72:1")}


def test_a_whole_nvl72_is_eighteen_trays_of_four_joined_chips(nvl72):
    rack = rack_of(nvlink_report())
    assert len(rack.trays) == 18 and all(len(t.chips) == 4 for t in rack.trays)
    assert set(chips(rack).values()) == {JOINED} and len(chips(rack)) == 72
    assert rack.state == JOINED and rack.reasons == [] and rack.summary["trays_in"] == 18
    assert [t.label for t in rack.trays[:3]] == ["00", "01", "02"], "the rack's shared prefix is left off"
    assert rack.name == "nvl72-00-tray-00 … nvl72-00-tray-17", "an unnamed domain goes by its trays"
    # Trays are stacked without overlapping, under the switch band, inside the rack.
    ys = [t.y for t in rack.trays]
    assert ys == sorted(ys) and min(b - a for a, b in itertools.pairwise(ys)) >= 20
    assert rack.trays[0].y > rack.band[1] + rack.band[3] and rack.trays[-1].y + 20 <= rack.height


def test_a_tray_that_leaves_turns_exactly_its_chips_down_and_says_why(nvl72):
    F.tray_leave(nvl72["nvl72-00-tray-03"])
    ingest(nvl72["nvl72-00-tray-03"])
    rack = rack_of(nvlink_report())
    down = sorted(g for g, s in chips(rack).items() if s == DOWN)
    assert down == [f"nvl72-00-tray-03/{i}" for i in range(4)]
    assert rack.state == DOWN and rack.summary[JOINED] == 68
    assert rack.reasons == [("nvl72-00-tray-03", ["gpus 0–3: fabric state In Progress"])]
    assert next(t for t in rack.trays if t.node == "nvl72-00-tray-03").state == "out"


def test_degraded_bandwidth_is_amber_and_a_warning_not_a_reason(nvl72):
    F.degrade(nvl72["nvl72-00-tray-05"], 2)
    ingest(nvl72["nvl72-00-tray-05"])
    rack = rack_of(nvlink_report())
    assert chips(rack)["nvl72-00-tray-05/2"] == DEGRADED and rack.state == DEGRADED
    assert rack.reasons == []
    assert rack.warnings == [("nvl72-00-tray-05", ["gpu 2: NVLink bandwidth degraded (Degraded)"])]


def test_imex_down_keeps_the_tray_out_with_its_chips_still_joined(nvl72):
    F.imex_down(nvl72["nvl72-00-tray-07"])
    ingest(nvl72["nvl72-00-tray-07"])
    rack = rack_of(nvlink_report())
    tray = next(t for t in rack.trays if t.node == "nvl72-00-tray-07")
    assert tray.state == "out" and tray.imex == "down"
    assert {c.state for c in tray.chips} == {JOINED}
    assert rack.reasons == [("nvl72-00-tray-07", ["IMEX down"])]


def test_a_silent_tray_is_drawn_from_its_last_report_and_says_so(nvl72):
    Node.objects.filter(name="nvl72-00-tray-01").update(reachable=False)
    rack = rack_of(nvlink_report())
    tray = next(t for t in rack.trays if t.node == "nvl72-00-tray-01")
    assert tray.state == "unreachable"
    assert rack.reasons[0][0] == "nvl72-00-tray-01" and rack.reasons[0][1][0].startswith("unreachable")


def test_the_template_carries_each_chips_gpu_and_state(nvl72):
    F.tray_leave(nvl72["nvl72-00-tray-00"])
    ingest(nvl72["nvl72-00-tray-00"])
    svg = render_to_string("dashboard/rack.svg", {"rack": rack_of(nvlink_report())})
    states = dict(re.findall(r'data-gpu="([^"]+)" data-state="(\w+)"', svg))
    assert len(states) == 72
    assert [g for g, s in states.items() if s == "down"] == [f"nvl72-00-tray-00/{i}" for i in range(4)]
    assert svg.count('class="light"') == 1 and 'data-rack-state="down"' in svg


def test_reasons_that_say_the_same_thing_for_many_cards_are_said_once():
    lines = [
        "gpu 0 fabric state In Progress",
        "gpu 1 fabric state In Progress",
        "gpu 3 fabric state In Progress",
        "gpu 2 joined no domain",
        "IMEX down",
    ]
    assert compress_reasons(lines) == ["gpus 0, 1, 3: fabric state In Progress", "gpu 2: joined no domain", "IMEX down"]
    assert compress_reasons(["gpu 0/mig1: Xid 79", "gpu 0/mig2: Xid 79"]) == ["gpus 0/mig1, 0/mig2: Xid 79"]


def test_short_names_cut_at_a_separator():
    assert short_names(["r1-tray-1", "r1-tray-12"]) == {"r1-tray-1": "1", "r1-tray-12": "12"}
    assert short_names(["solo"]) == {"solo": "solo"}


def test_a_rack_of_other_shape_is_drawn_too():
    domain = {
        "key": "u/1",
        "nodes": [
            {
                "node": f"n{i}",
                "reachable": True,
                "in_domain": True,
                "ready": True,
                "imex": "up",
                "out": [],
                "warnings": [],
                "cards": [{"index": j, "label": str(j), "joined": True, "degraded": False} for j in range(8)],
            }
            for i in range(2)
        ],
    }
    rack = RackRenderer(domain).render()
    xs = [c.x for c in rack.trays[0].chips]
    assert len(xs) == 8 and xs == sorted(xs)
    assert xs[-1] + rack.trays[0].chips[-1].w < rack.trays[0].imex_x, "eight chips still leave room for the IMEX light"


def test_the_racks_numbers_are_drawn_unlocalized_whatever_the_locale(settings):
    from django.utils import translation

    settings.USE_THOUSAND_SEPARATOR = True
    rack = {"width": 1234.5, "height": 2000, "band": (8, 9, 1000.25, 4), "trays": []}
    with translation.override("de"):
        svg = render_to_string("dashboard/rack.svg", {"rack": rack})
    assert 'viewBox="0 0 1234.5 2000" width="1234.5" height="2000"' in svg
    assert 'x="8" y="9" width="1000.25" height="4"' in svg and svg.endswith("</svg>\n")


# A tray's chips as rack.svg's loop over them drew them before the console's chips_svg filter did.
CHIP_LOOP = """{% load l10n %}{% localize off %}
    {% for chip in chips %}
    <g class="chip" data-gpu="{{ chip.gpu }}" data-state="{{ chip.state }}"{% if not chip.healthy %} data-unhealthy="1"{% endif %}>
      <title>{{ chip.title }}</title>
      <rect class="halo" x="{{ chip.halo.0 }}" y="{{ chip.halo.1 }}" width="{{ chip.halo.2 }}" height="{{ chip.halo.3 }}" rx="3"/>
      <rect class="die" x="{{ chip.x }}" y="{{ chip.y }}" width="{{ chip.w }}" height="{{ chip.h }}" rx="2"/>
    </g>
    {% endfor %}
{% endlocalize %}"""  # noqa: E501


def test_the_chips_filter_draws_the_bytes_the_template_loop_drew(nvl72):
    from django.template import engines

    from dashboard.racks import Chip
    from dashboard.templatetags.console import chips_svg

    F.tray_leave(nvl72["nvl72-00-tray-00"])
    ingest(nvl72["nvl72-00-tray-00"])
    rack = rack_of(nvlink_report())
    chips = [c for t in rack.trays for c in t.chips]
    chips.append(Chip(gpu='odd<&"> /1', label="1", state="down", x=1.5, y=2, w=10.25, h=3, healthy=False, title="a&b"))
    loop = engines["django"].from_string(CHIP_LOOP).render({"chips": chips})
    assert loop == "\n    " + chips_svg(chips) + "\n"
    assert any(not c.healthy for c in chips) and len(chips) == 73


# A rack's trays as rack.svg's loop over them drew them before the console's trays_svg filter did.
TRAY_LOOP = """{% load l10n console %}{% localize off %}
  {% for tray in rack.trays %}
  <g class="tray" data-tray="{{ tray.node }}" data-state="{{ tray.state }}">
    <title>{{ tray.title }}</title>
    <line class="link" x1="{{ tray.link.0 }}" y1="{{ tray.mid }}" x2="{{ tray.link.1 }}" y2="{{ tray.mid }}"/>
    <rect class="tray-body" x="{{ tray.x }}" y="{{ tray.y }}" width="{{ tray.w }}" height="{{ tray.h }}" rx="3"/>
    <text class="tray-label" x="{{ tray.label_x }}" y="{{ tray.text_y }}">{{ tray.label }}</text>
    {{ tray.chips|chips_svg }}
    <circle class="imex" data-imex="{{ tray.imex }}" cx="{{ tray.imex_x }}" cy="{{ tray.mid }}" r="3"><title>IMEX {{ tray.imex }}</title></circle>
  </g>
  {% endfor %}
{% endlocalize %}"""  # noqa: E501


def test_the_trays_filter_draws_the_bytes_the_template_loop_drew(nvl72, settings):
    from django.template import engines
    from django.utils import translation

    from dashboard.racks import Tray
    from dashboard.templatetags.console import trays_svg

    F.tray_leave(nvl72["nvl72-00-tray-00"])
    ingest(nvl72["nvl72-00-tray-00"])
    F.imex_down(nvl72["nvl72-00-tray-07"])
    ingest(nvl72["nvl72-00-tray-07"])
    Node.objects.filter(name="nvl72-00-tray-01").update(reachable=False)
    rack = rack_of(nvlink_report())
    odd = Tray(node='odd<&"> tray', label="<b>", y=1000.5, state="out", chips=[], imex="down", title='a "b" & c')
    rack.trays.append(odd)
    settings.USE_THOUSAND_SEPARATOR = True
    for language in ("en", "de"):
        with translation.override(language):
            loop = engines["django"].from_string(TRAY_LOOP).render({"rack": rack})
            assert loop == "\n  " + trays_svg(rack.trays) + "\n"
    assert {t.state for t in rack.trays} == {"in", "out", "unreachable"} and len(rack.trays) == 19
    assert 'data-tray="odd&lt;&amp;&quot;&gt; tray"' in trays_svg(rack.trays)
