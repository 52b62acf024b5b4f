"""``/metrics`` and ``/api/v1/summary`` count the same GPUs the same way, on a fleet with every kind of device.

The fleet: a GB200 NVL72 rack (72 cards, one NVLink domain), an HGX H100 box
and an A100 in MIG mode, all from the simulator's real captures through the
real ingestion; replicas holding cards and a MIG instance; a held card that
fails under its replica (unhealthy wins over used); a MIG card carved into
instances (counted as its instances only), one in MIG mode with none and an
instance without its MIG UUID (both held back); a cordoned tray and an
unreachable box (their free cards are not free capacity).

Both answers are read as a client reads them: the scrape's text, parsed back
by prometheus_client, and the summary's JSON.
"""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from agent.simulator import fleet as F
from core.models import ApiToken
from inventory.models import GPU, Node
from tests import people
from tests.api.fleet import add_model, ingest, ingest_fleet, place
from tests.observability.fleet import Scrape

pytestmark = pytest.mark.django_db

STATES = ("used", "free", "unhealthy", "held")


@pytest.fixture
def operator(db) -> APIClient:
    """An operator's token, which may read both answers."""
    _, secret = ApiToken.issue(people.operator("olivia"), "ctl")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    return client


@pytest.fixture
def fleet(db):
    sims = {s.name: s for s in ingest_fleet("gb200-nvl72:1,h100-hgx:2,a100-mig:1")}
    model = add_model()
    place(model, "nvl72-00-tray-00", [0, 1, 2, 3])
    place(model, "hgx-000", [0, 1], state="starting", shard_state="fetching")
    place(model, "mig-00", [1002])
    F.gpu_lost(sims["hgx-000"], 1)
    ingest(sims["hgx-000"])
    mig = Node.objects.get(name="mig-00")
    GPU.objects.create(node=mig, index=0, uuid="GPU-0", name="A100", gpu_class="a100-80g", mig_mode="Enabled")
    GPU.objects.create(node=mig, index=1, uuid="GPU-1", name="A100", gpu_class="a100-80g", mig_mode="enabled")
    GPU.objects.filter(node=mig, index=1001).update(mig_uuid="")
    Node.objects.filter(name="nvl72-00-tray-05").update(state="cordoned")
    Node.objects.filter(name="hgx-001").update(reachable=False)
    return sims


def test_every_gpu_count_on_metrics_is_the_summarys(operator, fleet):
    summary = {c["class"]: c for c in operator.get("/api/v1/summary").json()["gpus"]}
    scrape = Scrape(operator.get("/metrics").content.decode())
    metrics = scrape.by("llmgw_gpus", "class", "state")

    assert {cls for cls, _ in metrics} == set(summary), "the same classes: a carved MIG card is not one of them"
    for cls, counts in summary.items():
        for state in STATES:
            assert metrics.get((cls, state)) == counts[state], (cls, state)
        assert sum(metrics[(cls, s)] for s in (*STATES, "unavailable")) == counts["total"], cls
    # The fleet is what the docstring says, so the agreement above is about something.
    assert summary["h100-80g"] | {} == {
        "class": "h100-80g", "total": 16, "used": 1, "unhealthy": 1, "held": 0, "free": 6,
    }  # fmt: skip
    assert summary["gb200-185g"]["used"] == 4 and summary["gb200-185g"]["free"] == 64
    assert summary["a100-80g"]["held"] == 1 and summary["a100-80g"]["total"] == 1
    mig = next(c for c in summary.values() if c["class"].startswith("a100-80g-mig-"))
    assert (mig["total"], mig["used"], mig["held"], mig["free"]) == (4, 1, 1, 2)
