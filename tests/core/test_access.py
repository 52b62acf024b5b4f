"""Django's permissions on every door: the table core.access keeps, held against the real views.

The people (tests/people.py): an account holding exactly what a door needs
gets through it; one lacking any one of those permissions gets a 403 that
names it; a token is never more than its user at the time of the request.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from django.contrib.auth.models import Group, Permission
from django.contrib.messages import get_messages
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver
from hypothesis import given
from hypothesis import strategies as st
from rest_framework.test import APIClient

from catalog.models import CatalogModel
from core import access, roles
from core.credentials import hash_token
from core.models import ApiToken
from tests import people
from tests.api.fleet import add_model, ingest_fleet
from tests.ctl.transport import DjangoTransport, run

pytestmark = pytest.mark.django_db
ROOT = Path(__file__).resolve().parents[2]

# A path for each door's URL name, on the fleet the `fleet` fixture makes.
PATHS = {
    "api-summary": "/api/v1/summary",
    "api-moves-resume": "/api/v1/moves/resume",
    "api-nodes": "/api/v1/nodes",
    "api-node": "/api/v1/nodes/hgx-000",
    "api-node-state": "/api/v1/nodes/hgx-000/state",
    "api-node-logs": "/api/v1/nodes/hgx-000/logs",
    "api-models": "/api/v1/models",
    "api-model": "/api/v1/models/llama-8b",
    "api-model-scale": "/api/v1/models/llama-8b/scale",
    "api-model-capacity": "/api/v1/models/llama-8b/capacity",
    "api-model-prefetch": "/api/v1/models/llama-8b/prefetch",
    "api-capacity": "/api/v1/capacity",
    "api-replicas": "/api/v1/replicas",
    "api-explain": "/api/v1/explain-placement?model=llama-8b",
    "api-what-if": "/api/v1/what-if?lose=hgx-000",
    "api-nvlink": "/api/v1/nvlink",
    "api-fabrics": "/api/v1/fabrics",
    "api-fabric-topology": "/api/v1/fabrics/north/topology",
    "api-fabric-scan": "/api/v1/fabrics/north/scan",
    "api-orphans": "/api/v1/weights/orphans",
    "api-collect": "/api/v1/weights/collect",
    "gateway-keys": "/api/v1/keys",
    "gateway-key-revoke": "/api/v1/keys/nokey/revoke",
    "gateway-budgets": "/api/v1/budgets",
    "gateway-usage": "/api/v1/usage",
    "api-not-found": "/api/v1/no-such-thing",
    "api-schema": "/api/v1/schema",
    "metrics": "/metrics",
    "console-fleet": "/admin/fleet/",
    "console-nodes": "/admin/nodes/",
    "console-node": "/admin/nodes/hgx-000/",
    "console-node-state": "/admin/nodes/hgx-000/state",
    "console-nvlink": "/admin/nvlink/",
    "console-domain": "/admin/nvlink/999/",
    "console-what-if": "/admin/nvlink/what-if/",
    "console-fabrics": "/admin/fabrics/",
    "console-fabric": "/admin/fabrics/north/",
    "console-models": "/admin/models/",
    "console-model": "/admin/models/llama-8b/",
}
# A body each write may carry: valid enough to reach the view, harmless (most refer to nothing).
BODIES = {
    "api-node-state": {"state": "cordon"},
    "api-models": {"name": "x"},
    "api-model-scale": {"min": 1},
    "api-model-capacity": {"profile": "h100", "tokens_per_second": 1},
    "api-model-prefetch": {"nodes": ["nowhere"]},
    "gateway-keys": {"team": "nobody-here"},
    "gateway-budgets": {"scope": "team", "name": "nobody-here", "amount_micros": 1},
    "console-node-state": {"state": "cordon"},
}
DOORS = sorted(access.DOORS)
GUARDED = [door for door in DOORS if access.DOORS[door]]


@pytest.fixture
def fleet(db):
    ingest_fleet("h100-hgx:1@north")
    add_model()


def holding(name: str, perms: tuple[str, ...] | list[str]):
    """A staff account holding exactly ``perms`` (no group)."""
    user = people.person(name)
    wanted = {tuple(p.split(".", 1)) for p in perms}
    found = [
        p for p in Permission.objects.select_related("content_type") if (p.content_type.app_label, p.codename) in wanted
    ]
    assert len(found) == len(wanted), f"not every permission exists: {perms}"
    user.user_permissions.set(found)
    return user


def knock(user, door: tuple[str, str], *, read_only: bool = False) -> int:
    """The status ``user`` gets at ``door``: by API token for the API and /metrics, by session for the console."""
    name, method = door
    path, body = PATHS[name], BODIES.get(name)
    if name.startswith("console-"):
        client = Client()
        client.force_login(user)
        return client.post(path, body or {}).status_code if method == "POST" else client.get(path).status_code
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {people.token_of(user, read_only=read_only)}")
    return getattr(client, method.lower())(path, body, format="json").status_code


def urls_of(resolver: URLResolver, prefix: str = "") -> list[tuple[str, object]]:
    found = []
    for entry in resolver.url_patterns:
        if isinstance(entry, URLResolver):
            found += urls_of(entry, prefix + str(entry.pattern))
        elif isinstance(entry, URLPattern) and entry.name:
            found.append((entry.name, entry.callback))
    return found


# --- the table is complete -------------------------------------------------------------------------------------


def test_every_method_of_every_api_view_has_a_door():
    """An endpoint or a method added without a line in the table would be shut to all but superusers; say so here."""
    api_views = [
        (n, cb) for n, cb in urls_of(get_resolver()) if hasattr(cb, "view_class") and n.startswith(("api-", "gateway-"))
    ]
    assert len(api_views) >= 25
    for name, callback in api_views:
        for method in ("get", "post", "put", "patch", "delete"):
            if hasattr(callback.view_class, method):
                assert access.needs(name, method.upper()) is not None, f"{method.upper()} {name} has no door"


def test_every_console_page_has_a_door():
    from django.contrib import admin

    pages = [n for n, _ in urls_of(get_resolver()) if n.startswith("console-")]
    pages += [
        p.name for p in admin.site.get_urls() if isinstance(p, URLPattern) and (p.name or "").startswith("console-")
    ]
    assert pages
    for name in pages:
        assert access.methods_of(name), f"the console page {name} has no door"


def test_every_permission_the_table_names_exists():
    names = {f"{p.content_type.app_label}.{p.codename}" for p in Permission.objects.select_related("content_type")}
    assert {perm for perms in access.DOORS.values() for perm in perms} <= names


# --- exactly what the table names, and not one permission less --------------------------------------------------


@pytest.mark.parametrize("door", GUARDED, ids="-".join)
def test_exactly_the_doors_permissions_open_it(fleet, door):
    assert knock(holding("exact", access.DOORS[door]), door) not in (401, 403)


@pytest.mark.parametrize(
    ("door", "dropped"),
    [(d, p) for d in GUARDED for p in access.DOORS[d]],
    ids=lambda v: "-".join(v) if isinstance(v, tuple) else v,
)
def test_lacking_any_one_permission_is_a_403_that_names_it(fleet, door, dropped):
    less = [p for p in access.DOORS[door] if p != dropped]
    # Everything else the shipped groups hold, so only the one missing permission can be the reason.
    others = sorted(set().union(*access.shipped_roles().values()) - {dropped})
    user = holding("less", [*less, *others])
    assert knock(user, door) == 403
    if not door[0].startswith("console-"):
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {people.token_of(user)}")
        answer = getattr(client, door[1].lower())(PATHS[door[0]], BODIES.get(door[0]), format="json")
        text = answer.json()["error"] if door[0] != "metrics" else answer.content.decode()
        assert dropped in text


@pytest.mark.parametrize("door", DOORS, ids="-".join)
def test_staff_that_is_not_active_or_not_staff_gets_nothing(fleet, door):
    superuser_but_not_staff = people.person("nostaff", staff=False, is_superuser=True)
    assert knock(superuser_but_not_staff, door) in (302, 403) if door[0].startswith("console-") else (403,)
    inactive = people.operator("gone")
    token = people.token_of(inactive)
    inactive.is_active = False
    inactive.save()
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    if not door[0].startswith("console-"):
        assert getattr(client, door[1].lower())(PATHS[door[0]], BODIES.get(door[0]), format="json").status_code == 401


@given(
    held=st.sets(st.sampled_from(sorted({p for perms in access.DOORS.values() for p in perms}))),
    door=st.sampled_from(DOORS),
)
def test_the_rule_a_door_opens_to_whoever_holds_all_it_names(held, door):
    class Account:
        is_authenticated = is_active = is_staff = True
        is_superuser = False

        def has_perm(self, perm, obj=None):
            return perm in held

    allowed = access.refusal(Account(), door[0], door[1]) is None
    assert allowed == (set(access.DOORS[door]) <= held)


# --- a token is its user, now -------------------------------------------------------------------------------------


def test_a_permission_taken_from_a_user_is_taken_from_their_token_at_once(fleet):
    user = holding("tina", ["catalog.delete_catalogmodel", "catalog.view_catalogmodel"])
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {people.token_of(user)}")
    assert client.get("/api/v1/models").status_code == 200
    user.user_permissions.remove(Permission.objects.get(codename="delete_catalogmodel"))
    assert client.delete("/api/v1/models/llama-8b").status_code == 403
    assert CatalogModel.objects.filter(name="llama-8b").exists()


def test_a_group_taken_away_closes_the_token_too(fleet):
    user = people.operator("oscar")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {people.token_of(user)}")
    assert client.post("/api/v1/nodes/hgx-000/state", {"state": "cordon"}, format="json").status_code == 200
    user.groups.clear()
    assert client.post("/api/v1/nodes/hgx-000/state", {"state": "uncordon"}, format="json").status_code == 403


def test_a_user_allowed_only_to_add_tokens_mints_one_that_deletes_nothing(fleet):
    """The finding: such a token deleted a model (DELETE /api/v1/models/<name> answered 200)."""
    minter = holding("mint", ["core.add_apitoken", "core.view_apitoken"])
    client = Client()
    client.force_login(minter)
    page = client.post("/admin/core/apitoken/add/", {"user": minter.pk, "name": "mine", "read_only": ""})
    assert page.status_code == 302
    shown = " ".join(str(m) for m in get_messages(page.wsgi_request))
    secret = re.search(r"llmgw_adm_[\w-]+", shown).group(0)
    assert ApiToken.objects.get(user=minter).digest == hash_token(secret)
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    assert api.delete("/api/v1/models/llama-8b").status_code == 403
    assert api.post("/api/v1/keys", {"team": "x"}, format="json").status_code == 403
    assert CatalogModel.objects.filter(name="llama-8b").exists()


def test_a_view_only_staff_session_changes_nothing_through_the_api(fleet):
    viewer = people.person("vera", "viewers")
    client = APIClient(enforce_csrf_checks=False)
    client.force_login(viewer)
    assert client.get("/api/v1/nodes").status_code == 200
    assert client.post("/api/v1/keys", {"team": "x"}, format="json").status_code == 403
    assert (
        client.put(
            "/api/v1/budgets", {"scope": "team", "name": "x", "amount_micros": 10**12}, format="json"
        ).status_code
        == 403
    )
    assert client.post("/api/v1/nodes/hgx-000/state", {"state": "cordon"}, format="json").status_code == 403


# --- the shipped groups -------------------------------------------------------------------------------------------


def group_holder(name: str, group: str):
    return people.person(name, group)


@pytest.mark.parametrize("door", DOORS, ids="-".join)
def test_each_group_opens_the_doors_its_docs_promise(fleet, door):
    """viewers: every fleet read; operators: every fleet door; finance: keys, budgets and usage; none the others'."""
    perms = access.DOORS[door]
    finance_door = any(p.startswith("gateway.") for p in perms)
    fleet_door = bool(perms) and not finance_door
    expect = {
        "viewers": (fleet_door and door[1] == "GET") or not perms,
        "operators": fleet_door or not perms,
        "finance": finance_door or not perms,
    }
    for group, opens in expect.items():
        status = knock(group_holder(f"{group}-1", group), door)
        assert (status not in (401, 403)) == opens, f"{group} at {door}: {status}"


def test_migrate_made_the_groups_and_a_second_pass_keeps_an_operators_edit(db):
    roles.ensure()
    viewers = Group.objects.get(name="viewers")
    assert set(Group.objects.values_list("name", flat=True)) >= {"viewers", "operators", "finance"}
    viewers.permissions.clear()
    assert roles.ensure() == {"viewers": "kept", "operators": "kept", "finance": "kept"}
    assert not viewers.permissions.exists()
    roles.ensure(roles.SYNC)
    assert viewers.permissions.count() == len(access.shipped_roles()["viewers"])


# --- what the operator reads: docs/api.md and ctl ------------------------------------------------------------------


def documented_doors() -> dict[tuple[str, str], tuple[str, ...]]:
    """The table in docs/api.md's "Who may do what": method, path, permissions."""
    text = (ROOT / "docs/api.md").read_text()
    section = text.split("## Who may do what", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        found = re.match(r"\|\s*`(GET|POST|PUT|DELETE) ([^`]+)`\s*\|([^|]*)\|", line)
        if found:
            method, path, perms = found.groups()
            rows[(method, path)] = tuple(sorted(re.findall(r"`([a-z_]+\.[a-z_]+)`", perms)))
    return rows


def route_of(name: str) -> str:
    """A door's path as the docs write it: its route with <name> placeholders, from the real URL patterns."""
    for url_name, route in _routes():
        if url_name == name:
            return re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", route)
    raise AssertionError(f"no route named {name}")


def _routes(resolver=None, prefix: str = "") -> list[tuple[str, str]]:
    resolver = resolver or get_resolver()
    found = []
    for entry in resolver.url_patterns:
        if isinstance(entry, URLResolver):
            found += _routes(entry, prefix + str(entry.pattern))
        elif isinstance(entry, URLPattern) and entry.name:
            found.append((entry.name, "/" + prefix + str(entry.pattern)))
    return found


def test_the_docs_table_is_the_table_the_code_keeps():
    api = {
        (method, route_of(name)): tuple(sorted(perms))
        for (name, method), perms in access.DOORS.items()
        if (name.startswith(("api-", "gateway-")) and perms) or name == "metrics"
    }
    assert documented_doors() == api


def test_ctl_says_which_permission_was_missing(fleet, monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    monkeypatch.setenv("LLMGW_TOKEN", people.token_of(people.person("vic", "viewers")))
    code, out, err = run(["cordon", "hgx-000"], DjangoTransport())
    assert code != 0
    assert "inventory.change_node" in out + err and "'operators' group" in out + err
