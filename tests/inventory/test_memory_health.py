"""A card's memory health (ECC counters, remapped rows, retired pages): checked, stored, read back."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.utils import timezone

from agent.discovery import report as R
from agent.discovery.sources import Sources
from inventory.bounds import report_bounds
from inventory.models import GPU, Node
from inventory.report_schema import MAX_COUNTER, report_problems
from inventory.writes import ingest

A100_TEXT = (
    Path(__file__).resolve().parent.parent
    / "agent"
    / "captures"
    / ("nvidia-smi-q_a100-sxm4-80gb-x4_drv555.42.02_remap-pending.txt")
)


def a100_report() -> dict:
    """The agent's report of the kept A100 capture, GPU half only, as the agent would send it."""
    report = R.build_report(Sources(nvidia_smi_text=A100_TEXT), node=False)
    report["hostname"] = "a100-host"
    return report


def card(**memory) -> dict:
    return {"index": 0, "uuid": "GPU-1", "name": "NVIDIA A100", "class": "a100-80g", "health": [], **memory}


def test_the_agents_report_of_the_capture_is_accepted():
    report = a100_report()
    assert report["gpus"][1]["remapped_rows"]["pending"] is True
    assert report_problems(report, report_bounds()) == []


@pytest.mark.parametrize(
    ("memory", "words"),
    [
        ({"ecc": {"volatile": {"dram_correctable": -1}}}, "gpus[0].ecc.volatile.dram_correctable must be"),
        ({"ecc": {"aggregate": {"sram_uncorrectable": MAX_COUNTER + 1}}}, "gpus[0].ecc.aggregate.sram_uncorrectable"),
        ({"ecc": {"sram_threshold_exceeded": "No"}}, "gpus[0].ecc.sram_threshold_exceeded must be true or false"),
        ({"ecc": []}, "gpus[0].ecc must be an object"),
        ({"remapped_rows": {"pending": 1}}, "gpus[0].remapped_rows.pending must be true or false"),
        ({"remapped_rows": {"bank_availability": {"none": 1.5}}}, "gpus[0].remapped_rows.bank_availability.none"),
        ({"retired_pages": {"double_bit": "61"}}, "gpus[0].retired_pages.double_bit must be"),
    ],
)
def test_bad_memory_health_is_refused_with_its_path(memory, words):
    problems = report_problems({"gpus": [card(**memory)]}, report_bounds())
    assert any(words in p for p in problems), problems


@pytest.mark.django_db
def test_ingest_stores_the_facts_and_unknown_stays_null():
    now = timezone.now()
    node = Node.objects.create(name="a100-host", last_seen=now)
    ingest.ingest_report(node, a100_report(), now)
    pending = GPU.objects.get(node=node, index=1)
    assert pending.remapped_rows == {
        "correctable": 1,
        "uncorrectable": 0,
        "pending": True,
        "failure": False,
        "bank_availability": {"max": 639, "high": 1, "partial": 0, "low": 0, "none": 0},
    }
    assert pending.ecc["volatile"]["dram_correctable"] == 353
    assert pending.retired_pages is None  # "N/A" on an A100: it remaps rows, it retires no pages
    settled = GPU.objects.get(node=node, index=2)
    assert settled.remapped_rows["correctable"] == 1 and settled.health == []

    # A counter that rises is a change the next report writes.
    later = a100_report()
    later["gpus"][2]["ecc"]["aggregate"]["dram_correctable"] = 1
    result = ingest.ingest_report(node, later, now)
    assert result.gpus_updated == [2]
    rose = GPU.objects.get(node=node, index=2)
    assert rose.ecc["aggregate"]["dram_correctable"] == 1
    # What it was is kept, and when it changed, to read the rise against.
    assert rose.previous_memory["ecc"]["aggregate"]["dram_correctable"] == 0
    assert rose.previous_memory["remapped_rows"] == settled.remapped_rows and rose.memory_changed_at == now
    assert GPU.objects.get(node=node, index=1).previous_memory is None  # unchanged: nothing to keep
