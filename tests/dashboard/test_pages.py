"""Each console page for an operator, a colleague who is not staff, and nobody; what the pages show."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.utils import timezone
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.simulator import fleet as F
from catalog.models import CatalogModel
from core.models import AuditEntry, Finding, Severity
from inventory import reachability
from inventory.models import Node, NVLinkDomain
from inventory.writes.scans import record_scan
from placement.models import Autoscale, PlacementExplanation, ScaleEvent
from tests.api.fleet import add_model, ingest, ingest_fleet, place

pytestmark = pytest.mark.django_db


@pytest.fixture
def fleet(db) -> dict[str, F.SimNode]:
    sims = {s.name: s for s in ingest_fleet("gb200-nvl72:1,h100-hgx:2,a100-mig:1,cpu:1")}
    model = add_model()
    place(model, "hgx-000", [0, 1])
    return sims


def fabric_id() -> str:
    from inventory.models import IBPort

    guid = IBPort.objects.exclude(sm_guid="").values_list("sm_guid", flat=True).first()
    return f"sm-{guid}"


def pages(fleet) -> list[str]:
    domain = NVLinkDomain.objects.get()
    return [
        "/admin/fleet/",
        "/admin/fleet/live",
        "/admin/nodes/",
        "/admin/nodes/live",
        "/admin/nodes/hgx-000/",
        "/admin/nodes/hgx-000/live",
        "/admin/nvlink/",
        "/admin/nvlink/live",
        f"/admin/nvlink/{domain.pk}/",
        f"/admin/nvlink/{domain.pk}/live",
        "/admin/fabrics/",
        "/admin/fabrics/live",
        f"/admin/fabrics/{fabric_id()}/",
        f"/admin/fabrics/{fabric_id()}/live",
        "/admin/models/",
        "/admin/models/live",
        "/admin/models/llama-8b/",
        "/admin/models/llama-8b/live",
        "/admin/nvlink/what-if/?lose=hgx-000",
        "/admin/nvlink/what-if/live?lose=hgx-000",
    ]


def test_every_page_renders_for_an_operator(operator, fleet):
    for path in pages(fleet):
        answer = operator.get(path)
        assert answer.status_code == 200, path
        assert b"data-live-fragment" in answer.content, path


def test_nobody_and_a_colleague_who_is_not_staff_are_sent_to_the_login(nobody, colleague, fleet):
    for client in (nobody, colleague):
        for path in pages(fleet):
            answer = client.get(path)
            assert answer.status_code == 302, path
            assert answer["Location"].startswith("/admin/login/?next="), path


def test_unknown_subjects_are_not_found(operator, fleet):
    for path in ("/admin/nodes/nope/", "/admin/nvlink/99999/", "/admin/fabrics/sm-0x1/", "/admin/models/nope/"):
        assert operator.get(path).status_code == 404, path


def test_the_admin_index_links_the_console(operator):
    index = operator.get("/admin/").content.decode()
    for path in ("/admin/fleet/", "/admin/nodes/", "/admin/nvlink/", "/admin/fabrics/", "/admin/models/"):
        assert f'href="{path}"' in index, path


def test_a_page_says_it_is_not_live_until_its_socket_opens(operator, fleet):
    page = operator.get("/admin/fleet/").content.decode()
    assert 'data-live-state="off"' in page and "not live" in page
    assert 'data-live-socket="/ws/console/fleet/"' in page
    assert "/static/dashboard/live.js" in page and "/static/dashboard/console.css" in page


def test_the_console_and_admin_static_files_are_served_without_collectstatic(nobody, settings):
    settings.DEBUG = False
    for path in ("/static/dashboard/live.js", "/static/dashboard/console.css", "/static/admin/css/base.css"):
        answer = nobody.get(path)
        assert answer.status_code == 200, path
    assert nobody.get("/static/../llmgw/settings.py").status_code == 404
    assert nobody.get("/static/dashboard/nope.js").status_code == 404


def test_the_fleet_page_counts_and_tiles(operator, fleet):
    Node.objects.filter(name="cpu-00").update(reachable=False)
    page = operator.get("/admin/fleet/").content.decode()
    assert '<li data-count="unreachable" class="bad">1 unreachable</li>' in page
    assert 'data-node="cpu-00" data-condition="unreachable"' in page
    assert 'data-node="hgx-001" data-condition="ready"' in page
    assert '<tr data-class="h100-80g">' in page
    assert "No open findings" in page


def test_the_fleet_page_shows_an_open_partition(operator, fleet):
    now = timezone.now()
    Node.objects.filter(name__startswith="nvl72-").update(last_seen=now - timedelta(seconds=60))
    assert reachability.sweep(now).partitions == ["the fleet"]
    page = operator.get("/admin/fleet/").content.decode()
    assert 'data-partition="the fleet"' in page and "18 of 22 nodes went silent together" in page
    assert "llmgw ctl resume-moves" in page
    assert "a partition of the whole fleet holds until then" in page


def test_the_fleet_page_shows_when_a_racks_partition_turns_into_losses(operator, fleet):
    now = timezone.now()
    Node.objects.filter(name__in=["hgx-000", "hgx-001"]).update(
        labels={"rack": "r9"}, last_seen=now - timedelta(seconds=60)
    )
    assert reachability.sweep(now).partitions == ["rack=r9"]
    page = operator.get("/admin/fleet/").content.decode()
    assert 'data-partition="rack=r9"' in page and "<span data-partition-until>" in page
    assert "those still silent are lost and their replicas moved at the normal rate" in page


def test_the_fleet_page_lists_the_doctors_open_findings(operator, fleet):
    Finding.objects.create(
        kind="imex_down",
        subject="nvl72-00-tray-03",
        message="IMEX is down",
        severity=Severity.CRITICAL,
        first_seen=timezone.now(),
        last_seen=timezone.now(),
    )
    page = operator.get("/admin/fleet/").content.decode()
    assert '<li class="bad"><strong>nvl72-00-tray-03</strong>: IMEX is down' in page
    assert "No open findings" not in page


def test_a_parked_model_is_on_the_fleet_page_with_a_link_to_why(operator, fleet):
    from catalog.models import CatalogModel

    CatalogModel.objects.filter(name="llama-8b").update(
        parked_at=timezone.now(), parked_error="engine exited 1", failure_streak=3
    )
    page = operator.get("/admin/fleet/").content.decode()
    assert "parked after 3 failed starts: engine exited 1" in page
    assert 'href="/admin/models/llama-8b/#why"' in page


def test_an_hgx_node_shows_its_nvlink_matrix_numa_and_nearest_adapter(operator, fleet):
    page = operator.get("/admin/nodes/hgx-000/").content.decode()
    cells = re.findall(r'data-link="(\w+)"', page)
    assert cells.count("nv") == 8 * 7 and cells.count("self") == 8
    assert "Every card reaches every other over NVLink" in page
    assert re.search(r"<td>mlx5_0 <small>\(PIX\)</small></td>", page)
    assert 'data-gpu="hgx-000/0"' in page and "held by" in page.lower()
    assert "llama-8b#" in page, "the cards a shard holds say whose"


def test_a_mig_node_shows_its_instances_as_card_slash_mig_with_their_class(operator, fleet):
    page = operator.get("/admin/nodes/mig-00/").content.decode()
    assert "MIG instances" in page and "NVLink matrix" not in page
    for i in range(4):
        assert f'data-gpu="mig-00/0/mig{i}"><td>0/mig{i}</td><td>a100-80g-mig-1g.20gb</td>' in page


def test_a_tray_page_shows_its_domain_and_imex(operator, fleet):
    domain = NVLinkDomain.objects.get()
    page = operator.get("/admin/nodes/nvl72-00-tray-04/").content.decode()
    assert f'href="/admin/nvlink/{domain.pk}/"' in page
    assert 'IMEX <span class="ok">up</span>' in page and "channels 0" in page


def test_unhealthy_cards_and_missing_avx2_are_said(operator, fleet):
    F.gpu_lost(fleet["hgx-001"], 3)
    ingest(fleet["hgx-001"])
    Node.objects.filter(name="cpu-00").update(cpu_flags=["sse4_2"])
    assert "gpu 3: lost by the driver" in operator.get("/admin/nodes/hgx-001/").content.decode()
    assert "no AVX2" in operator.get("/admin/nodes/cpu-00/").content.decode()


def test_cordon_drain_and_uncordon_from_the_page_are_audited(operator, fleet):
    page = operator.get("/admin/nodes/hgx-001/").content.decode()
    assert 'name="csrfmiddlewaretoken"' in page
    for word, state in (("cordon", "cordoned"), ("drain", "draining"), ("uncordon", "ready")):
        answer = operator.post("/admin/nodes/hgx-001/state", {"state": word})
        assert answer.status_code == 302 and answer["Location"] == "/admin/nodes/hgx-001/"
        assert Node.objects.get(name="hgx-001").state == state
    actions = list(AuditEntry.objects.filter(target="hgx-001").order_by("at").values_list("action", "actor"))
    assert actions == [("cordon", "olivia"), ("drain", "olivia"), ("uncordon", "olivia")]
    assert AuditEntry.objects.filter(target="hgx-001").first().detail["via"] == "console"


def test_a_state_change_needs_a_post_with_csrf_from_an_operator(nobody, colleague, olivia, fleet):
    from django.test import Client

    strict = Client(enforce_csrf_checks=True)
    strict.force_login(olivia)
    assert strict.post("/admin/nodes/hgx-001/state", {"state": "cordon"}).status_code == 403
    assert nobody.post("/admin/nodes/hgx-001/state", {"state": "cordon"}).status_code == 302
    assert colleague.post("/admin/nodes/hgx-001/state", {"state": "drain"}).status_code == 302
    assert Node.objects.get(name="hgx-001").state == "ready"
    assert not AuditEntry.objects.filter(target="hgx-001").exists()


def test_a_word_that_is_not_a_state_is_refused_with_what_to_send(operator, fleet):
    answer = operator.post("/admin/nodes/hgx-001/state", {"state": "reboot"}, follow=True)
    assert "state must be one of cordon, uncordon or drain" in answer.content.decode().lower()
    assert Node.objects.get(name="hgx-001").state == "ready"
    assert operator.get("/admin/nodes/hgx-001/state").status_code == 405


def test_the_rack_page_draws_the_domain_and_lists_what_keeps_a_tray_out(operator, fleet):
    F.tray_leave(fleet["nvl72-00-tray-09"])
    ingest(fleet["nvl72-00-tray-09"])
    page = operator.get("/admin/nvlink/").content.decode()
    states = dict(re.findall(r'data-gpu="([^"]+)" data-state="(\w+)"', page))
    assert len(states) == 72 and sorted(g for g, s in states.items() if s == "down") == [
        f"nvl72-00-tray-09/{i}" for i in range(4)
    ]
    assert '<li data-tray="nvl72-00-tray-09"><a href="/admin/nodes/nvl72-00-tray-09/">' in page
    assert "gpus 0–3: fabric state In Progress" in page


def test_the_rack_page_reads_a_fixed_number_of_queries_however_many_racks(operator, db, django_assert_max_num_queries):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    ingest_fleet("gb200-nvl72:1")
    with CaptureQueriesContext(connection) as one:
        operator.get("/admin/nvlink/live")
    ingest_fleet("gb200-nvl72:2", prefix="more-")
    with django_assert_max_num_queries(len(one.captured_queries)):
        page = operator.get("/admin/nvlink/live").content.decode()
    assert page.count("data-gpu=") == 72 * 3
    headings = re.findall(r">([\w-]+-tray-00) … ", page)
    assert headings == ["more-nvl72-00-tray-00", "more-nvl72-01-tray-00", "nvl72-00-tray-00"], "racks by name"


def test_the_node_list_reads_a_fixed_number_of_queries_however_many_nodes(operator, db, django_assert_max_num_queries):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    ingest_fleet("h100-hgx:2")
    with CaptureQueriesContext(connection) as few:
        operator.get("/admin/nodes/live")
    ingest_fleet("h100-hgx:6,a100-mig:2", prefix="more-")
    with django_assert_max_num_queries(len(few.captured_queries)):
        operator.get("/admin/nodes/live")


def test_the_fleet_page_reads_a_fixed_number_of_queries_however_many_nodes(operator, db, django_assert_max_num_queries):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    ingest_fleet("h100-hgx:2")
    with CaptureQueriesContext(connection) as few:
        operator.get("/admin/fleet/live")
    ingest_fleet("gb200-nvl72:1,h100-hgx:6,a100-mig:2,cpu:1", prefix="more-")
    with django_assert_max_num_queries(len(few.captured_queries)):
        page = operator.get("/admin/fleet/live").content.decode()
    assert page.count('<a class="tile" href=') == 2 + 18 + 6 + 2 + 1


def test_a_tile_shows_each_node_as_the_node_list_does(db):
    """The strip's lean read gives the node list's own figures: counts, cards out of placement, domain, state."""
    from placement.reads import node_list, node_tiles

    sims = {s.name: s for s in ingest_fleet("gb200-nvl72:1,h100-hgx:3,a100-mig:2,cpu:1")}
    F.gpu_lost(sims["hgx-001"], 2)
    ingest(sims["hgx-001"])
    place(add_model(), "hgx-000", [0, 1, 2])
    Node.objects.filter(name="hgx-002").update(state="cordoned", reachable=False, lost=True)
    keys = ("id", "state", "reachable", "lost", "gpu_total", "gpu_free", "unhealthy_gpus", "nvlink_domain")
    listed = [{k: n[k] for k in keys if k in n} for n in node_list()]
    assert node_tiles() == listed
    assert any(t["unhealthy_gpus"] for t in listed) and any("nvlink_domain" in t for t in listed)


# The strip of tiles as the fleet fragment's template loop drew it before the view built it.
TILE_LOOP = (
    "{% for n in nodes %}"
    '<a class="tile" href="{% url \'admin:console-node\' n.id %}" data-node="{{ n.id }}" '
    'data-condition="{{ n.condition }}" title="{{ n.id }}: {{ n.condition }}'
    "{% if n.gpu_total %}, {{ n.gpu_free }}/{{ n.gpu_total }} devices free{% endif %}"
    '{% if n.nvlink_domain %}, NVLink {{ n.nvlink_domain }}{% endif %}"></a>'
    "{% endfor %}"
)


def test_the_fleet_pages_tiles_are_the_bytes_the_template_loop_drew(db):
    from django.template import engines

    from dashboard.views import fleet as view

    sims = ingest_fleet("gb200-nvl72:1,h100-hgx:2,a100-mig:1,cpu:1")
    Node.objects.filter(name="cpu-00").update(reachable=False)
    nodes = view.context()["nodes"]
    nodes.append({"id": "odd<&\"'> name", "condition": "ready", "gpu_total": 8, "gpu_free": 2, "nvlink_domain": "a&b"})
    assert str(view.tiles(nodes)) == engines["django"].from_string(TILE_LOOP).render({"nodes": nodes})
    assert len(nodes) == len(sims) + 1 and any(n.get("nvlink_domain") for n in nodes)


# The doctor's findings as the fleet fragment's template loop drew them before the view built them.
FINDING_LOOP = (
    "{% for f in findings %}<li class=\"{% if f.severity == 'critical' %}bad{% else %}warn{% endif %}\">"
    '<strong>{{ f.subject }}</strong>: {{ f.message }} <small>since {{ f.first_seen|date:"Y-m-d H:i" }}</small></li>'
    "{% endfor %}"
)


@pytest.mark.parametrize("zone", ["UTC", "America/St_Johns", "Asia/Kathmandu"])
def test_the_fleet_pages_findings_are_the_bytes_the_template_loop_drew(db, zone):
    """Odd characters escaped, both severities, and times near midnight in the current zone, shared and not."""
    from datetime import UTC, datetime

    from django.template import engines

    from dashboard.views import fleet as view
    from observability.findings import open_findings

    shared = datetime(2026, 12, 31, 23, 59, 59, 999999, tzinfo=UTC)
    times = [shared, shared, datetime(2026, 1, 1, 0, 0, tzinfo=UTC), datetime(999, 3, 4, 5, 6, tzinfo=UTC)]
    for i, (at, severity) in enumerate(zip(times, [Severity.CRITICAL, Severity.WARNING] * 2, strict=True)):
        Finding.objects.create(
            kind="node_silent",
            subject=f"n<{i}>&\"'",
            message=f"it's <b>{i}</b> & more",
            severity=severity,
            first_seen=at,
            last_seen=at,
        )
    with timezone.override(zone):
        findings = open_findings()
        want = engines["django"].from_string(FINDING_LOOP).render({"findings": findings})
        assert str(view.finding_items(findings)) == want
        assert view.context()["finding_items"] == want
    assert want.count('<li class="bad">') == 2 and "&lt;b&gt;" in want and "0999-03-04" in want


def test_a_fabric_without_a_scan_says_so_and_one_with_a_scan_is_drawn_with_our_adapters(operator, fleet):
    fabric = fabric_id()
    page = operator.get(f"/admin/fabrics/{fabric}/").content.decode()
    assert 'data-scan="none"' in page and "No scan of this fabric" in page
    node = Node.objects.get(name="hgx-000")
    record_scan(node, {"fabric": fabric.replace("sm-", "sm:", 1), "output": F.scan_capture()}, timezone.now())
    page = operator.get(f"/admin/fabrics/{fabric}/").content.decode()
    assert 'data-scan="ok"' in page and '<svg class="topology"' in page
    ours = set(re.findall(r'data-state="(\w+)" data-node="([^"]+)"', page))
    assert ("active", "hgx-000") in ours and ("active", "nvl72-00-tray-00") in ours
    assert page.count('data-role="leaf"') == 31


def test_a_failed_scan_is_said_with_when_and_the_last_good_map_kept(operator, fleet):
    fabric = fabric_id()
    node = Node.objects.get(name="hgx-000")
    key = fabric.replace("sm-", "sm:", 1)
    record_scan(node, {"fabric": key, "output": F.scan_capture()}, timezone.now())
    record_scan(node, {"fabric": key, "error": "ibnetdiscover: umad port 1 not active"}, timezone.now())
    page = operator.get(f"/admin/fabrics/{fabric}/").content.decode()
    assert 'data-scan="failed"' in page and "umad port 1 not active" in page and "this is the map from" in page
    assert 'data-scan="ok"' in page


def test_the_models_page_shows_desired_and_ready_and_the_explanation(operator, fleet):
    from catalog.models import CatalogModel

    model = CatalogModel.objects.get(name="llama-8b")
    PlacementExplanation.objects.create(
        model=model,
        placed=False,
        rejections=[{"profile": "h100", "node": "hgx-001", "reason": "cordoned: takes nothing new"}],
    )
    listing = operator.get("/admin/models/").content.decode()
    assert 'data-model="llama-8b"' in listing and "1 / 1" in listing and "cannot be placed" in listing
    page = operator.get("/admin/models/llama-8b/").content.decode()
    assert "cordoned: takes nothing new" in page and 'href="/admin/nodes/hgx-001/"' in page
    assert 'on <a href="/admin/nodes/hgx-000/">hgx-000</a> gpu 0, 1' in page


def test_the_models_page_names_a_models_lora_adapters(operator, fleet):
    from catalog.models import Adapter, CatalogModel

    Adapter.objects.create(model=CatalogModel.objects.get(name="llama-8b"), name="llama-sql", source="hf://a/b")
    listing = operator.get("/admin/models/").content.decode()
    assert "<small>adapters llama-sql</small>" in listing


def test_the_model_page_shows_the_autoscalers_count_reason_and_history(operator, fleet):
    model = CatalogModel.objects.get(name="llama-8b")
    CatalogModel.objects.filter(pk=model.pk).update(max_replicas=4)
    now = timezone.now()
    PlacementExplanation.objects.create(model=model, placed=True)
    reason = "in flight 41 on 2 replicas, capacity 16 each at 80 % → 4; up from 2 after 15 s above it"
    Autoscale.objects.create(
        model=model,
        desired=4,
        direction="up",
        reason=reason,
        decided_at=now,
        in_flight=41,
        workers=2,
        load_source="redis",
        capacity_profile="h100",
        capacity_concurrency=16,
        capacity_measured=True,
    )
    ScaleEvent.objects.create(model=model, at=now, from_replicas=2, to_replicas=4, direction="up", reason=reason)
    page = operator.get("/admin/models/llama-8b/").content.decode()
    assert 'data-autoscale="up"' in page and "<strong>4</strong> wanted (up)" in page
    assert "in flight 41 on 2 replicas, capacity 16 each at 80 % → 4" in page
    assert "load from redis (2 gateway workers): 41 in flight" in page and "2 → 4 (up)" in page
    assert "ready of <strong>4</strong> desired" in page
    fragment = operator.get("/admin/models/llama-8b/live").content.decode()
    assert 'data-autoscale="up"' in fragment, "the live fragment the page re-fetches carries it too"


def test_the_model_page_shows_each_starts_phases_and_where_a_start_stands(operator, fleet):
    from placement.models import Shard

    model = CatalogModel.objects.get(name="llama-8b")
    CatalogModel.objects.filter(pk=model.pk).update(max_replicas=2)
    ready = model.replicas.get()
    Shard.objects.filter(replica=ready).update(phases={"fetch_s": 0.2, "load_s": 41.0, "weights_local": True})
    starting = place(model, "hgx-001", [0], state="starting", shard_state="starting")
    Shard.objects.filter(replica=starting).update(phases={"fetch_s": 1.0, "load_s": 5.0, "weights_local": True})
    page = operator.get("/admin/models/llama-8b/live").content.decode()
    assert "fetch 0 s (local), load 41 s" in page
    assert "llama-8b: replica starting on hgx-001, loading the engine, about 55 s left" in page
    assert "the defaults" in page, "nothing measured yet: the estimate says what it used"


def test_the_model_page_shows_prefetch_progress_live(operator, fleet):
    from catalog.models import WeightPrefetch

    model = CatalogModel.objects.get(name="llama-8b")
    now = timezone.now()
    WeightPrefetch.objects.create(
        model=model, node="hgx-001", source="hf://m", requested_by="olivia", bytes_done=4 * 10**9,
        bytes_total=16 * 10**9, updated_at=now,
    )  # fmt: skip
    WeightPrefetch.objects.create(
        model=model, node="hgx-000", source="hf://m", requested_by="olivia", error="no space left on device",
        updated_at=now, done_at=now,
    )  # fmt: skip
    fragment = operator.get("/admin/models/llama-8b/live").content.decode()
    assert 'data-prefetch="hgx-001" data-state="fetching"' in fragment
    assert '<progress max="100" value="25"></progress> 25 % of' in fragment
    assert 'data-state="failed"' in fragment and "no space left on device" in fragment
    assert "Weights prefetched" in operator.get("/admin/models/llama-8b/").content.decode()


def test_the_node_table_is_paged_by_name_and_its_live_part_keeps_the_page(operator, db, monkeypatch):
    from dashboard.views import nodes as view

    monkeypatch.setattr(view, "PAGE", 3)
    ingest_fleet("h100-hgx:7")
    first = operator.get("/admin/nodes/").content.decode()
    assert re.findall(r'<tr data-node="([^"]+)"', first) == ["hgx-000", "hgx-001", "hgx-002"]
    assert 'href="/admin/nodes/?after=hgx-002"' in first and "first page" not in first
    second = operator.get("/admin/nodes/?after=hgx-002").content.decode()
    assert re.findall(r'<tr data-node="([^"]+)"', second) == ["hgx-003", "hgx-004", "hgx-005"]
    assert 'data-live-fragment="/admin/nodes/live?after=hgx-002"' in second and "first page" in second
    live = operator.get("/admin/nodes/live?after=hgx-005").content.decode()
    assert re.findall(r'<tr data-node="([^"]+)"', live) == ["hgx-006"] and "data-next-after" not in live
    assert "No node after hgx-zzz" in operator.get("/admin/nodes/?after=hgx-zzz").content.decode()
    assert operator.get("/admin/nodes/?after=a%00b").status_code == 400


def test_a_page_of_the_node_table_reads_the_same_queries_wherever_it_starts(
    operator, db, monkeypatch, django_assert_max_num_queries
):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from dashboard.views import nodes as view

    monkeypatch.setattr(view, "PAGE", 3)
    ingest_fleet("h100-hgx:9")
    with CaptureQueriesContext(connection) as first:
        operator.get("/admin/nodes/live")
    with django_assert_max_num_queries(len(first.captured_queries)):
        operator.get("/admin/nodes/live?after=hgx-005")


@settings(max_examples=300, deadline=None)
@given(
    names=st.lists(
        st.one_of(
            st.text(max_size=30),
            st.sampled_from(["nvl72-00-tray-03", "a<b>&\"'", "e\u0301\u0301", "\u1100\u1161", "\u0301x"]),
        ),
        max_size=60,
    ),
    limit=st.sampled_from([0, 1, 2, 5, 40, 300]),
)
def test_a_partitions_names_are_clipped_as_join_and_truncatechars_clipped_them(names, limit):
    from django.template import engines

    from dashboard.templatetags.console import joined_clipped

    def render(text: str) -> str:
        return engines["django"].from_string("{% load console %}" + text).render({"names": names, "limit": limit})

    whole = render('{{ names|join:", "|truncatechars:limit }}')
    assert render("{{ names|joined_clipped:limit }}") == whole
    assert joined_clipped(names, limit) == whole
