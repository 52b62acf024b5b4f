"""Who may do what: the Django model permissions every door of the admin listener needs, in one place.

A *door* is a URL name and an HTTP method: ``("gateway-keys", "POST")``.
The admin API (api.base), the console's pages (dashboard.site), their live
sockets and ``/metrics`` all ask :func:`refusal` before doing anything, so a
user's Django permissions — given in the admin, through groups or one by
one — decide alike whichever way they come in. A token acts as its user at
the time of each request: a permission taken from the user is taken from
every token of theirs at once (nothing about permissions is stored on a
token but ``read_only``, which can only take away).

The rules, in order:

1. Only an active staff account gets through any door; a superuser through
   every one (Django's own rule for ``has_perms``).
2. A read-only token opens no door but reads (GET, HEAD, OPTIONS).
3. The account holds every permission :data:`DOORS` names for the door.
   HEAD and OPTIONS need what GET needs. A door that is not in the table
   is shut to everyone but superusers, so an endpoint added without an
   entry fails closed (and tests/core/test_access.py fails).

The groups shipped for operators (:func:`shipped_roles`, created by the first
``migrate`` and kept up to date by ``llmgw roles``) are built from the same
table, so a role always opens the doors docs/api.md says it opens.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any, Protocol

from django.apps import apps as django_apps

READS = frozenset({"GET", "HEAD", "OPTIONS"})

# (URL name, method) -> the permissions it needs, as "app_label.codename".
DOORS: dict[tuple[str, str], tuple[str, ...]] = {
    # The admin API (api/urls.py).
    ("api-summary", "GET"): ("inventory.view_node",),
    ("api-moves-resume", "POST"): ("placement.change_nodelossmove",),
    ("api-nodes", "GET"): ("inventory.view_node",),
    ("api-node", "GET"): ("inventory.view_node",),
    ("api-node-state", "POST"): ("inventory.change_node",),
    ("api-node-logs", "GET"): ("inventory.view_node", "placement.view_shard"),
    ("api-models", "GET"): ("catalog.view_catalogmodel",),
    ("api-models", "POST"): ("catalog.add_catalogmodel",),
    ("api-model", "DELETE"): ("catalog.delete_catalogmodel",),
    ("api-model-scale", "POST"): ("catalog.change_catalogmodel",),
    ("api-model-capacity", "PUT"): ("catalog.add_capacitymeasurement", "catalog.change_capacitymeasurement"),
    ("api-model-prefetch", "POST"): ("catalog.add_weightprefetch",),
    ("api-capacity", "GET"): ("catalog.view_capacitymeasurement",),
    ("api-replicas", "GET"): ("placement.view_replica",),
    ("api-explain", "GET"): ("placement.view_placementexplanation",),
    ("api-what-if", "GET"): ("inventory.view_node", "placement.view_replica"),
    ("api-nvlink", "GET"): ("inventory.view_nvlinkdomain",),
    ("api-fabrics", "GET"): ("inventory.view_ibport",),
    ("api-fabric-topology", "GET"): ("inventory.view_ibport",),
    ("api-fabric-scan", "POST"): ("inventory.add_fabricscan",),
    ("api-orphans", "GET"): ("catalog.view_weightcollection",),
    ("api-collect", "POST"): ("catalog.add_weightcollection",),
    ("gateway-keys", "GET"): ("gateway.view_apikey",),
    ("gateway-keys", "POST"): ("gateway.add_apikey",),
    ("gateway-key-revoke", "POST"): ("gateway.change_apikey",),
    ("gateway-budgets", "GET"): ("gateway.view_budget",),
    ("gateway-budgets", "PUT"): ("gateway.add_budget", "gateway.change_budget"),
    ("gateway-usage", "GET"): ("gateway.view_usagerecord",),
    # Any other path under /api/v1/ answers a 404 sentence to any staff account.
    ("api-not-found", "GET"): (),
    ("api-not-found", "POST"): (),
    ("api-not-found", "PUT"): (),
    ("api-not-found", "PATCH"): (),
    ("api-not-found", "DELETE"): (),
    ("api-schema", "GET"): (),
    # Prometheus's scrape: the fleet's figures.
    ("metrics", "GET"): ("inventory.view_node",),
    # The console (dashboard/site.py); a page's live fragment and socket need what the page needs.
    ("console-fleet", "GET"): ("inventory.view_node",),
    ("console-nodes", "GET"): ("inventory.view_node",),
    ("console-node", "GET"): ("inventory.view_node",),
    ("console-node-state", "POST"): ("inventory.change_node",),
    ("console-nvlink", "GET"): ("inventory.view_nvlinkdomain",),
    ("console-domain", "GET"): ("inventory.view_nvlinkdomain",),
    ("console-what-if", "GET"): ("inventory.view_node", "placement.view_replica"),
    ("console-fabrics", "GET"): ("inventory.view_ibport",),
    ("console-fabric", "GET"): ("inventory.view_ibport",),
    ("console-models", "GET"): ("catalog.view_catalogmodel",),
    ("console-model", "GET"): ("catalog.view_catalogmodel",),
}

LIVE_SUFFIX = "-live"
"""A page's fragment (``console-fleet-live``) opens for whoever may open the page."""

# The apps whose records make the fleet (an operator's business) and the gateway's tenancy (finance's).
FLEET_APPS = ("inventory", "catalog", "placement")
FINANCE_APPS = ("gateway",)
# Everyone with a role may see the doctor's findings and the task runs, and mint tokens for themselves.
EVERY_ROLE = ("core.view_finding", "core.view_taskrun", "core.add_apitoken", "core.view_apitoken")


class Account(Protocol):
    is_active: bool
    is_staff: bool
    is_superuser: bool

    def has_perm(self, perm: str, obj: Any = None) -> bool: ...


def needs(url_name: str | None, method: str) -> tuple[str, ...] | None:
    """The permissions a door needs, or None when the table has no such door (shut but to superusers).

    ``url_name`` None: no door at all (a method the endpoint does not have), whose answer is a
    405 sentence that any active staff account may read.
    """
    if url_name is None:
        return ()
    if url_name.endswith(LIVE_SUFFIX):
        url_name = url_name.removesuffix(LIVE_SUFFIX)
    method = "GET" if method in READS else method
    return DOORS.get((url_name, method))


def methods_of(url_name: str) -> set[str]:
    """The methods the table opens on a URL (none: the URL is not in the table)."""
    url_name = url_name.removesuffix(LIVE_SUFFIX)
    return {method for name, method in DOORS if name == url_name}


def refusal(account: Account | None, url_name: str | None, method: str, *, read_only: bool = False) -> str | None:
    """Why ``account`` may not pass a door, in a sentence that names what is missing, or None when it may."""
    if account is None or not getattr(account, "is_authenticated", False):
        return "log in, or send an API token as 'Authorization: Bearer <token>'"
    if not account.is_active or not account.is_staff:
        return "this account is not active staff: an administrator must mark it active and staff in the admin"
    if read_only and method not in READS:
        return "this token is read-only: it may read (GET) but not change anything; use an operator's token"
    wanted = needs(url_name, method)
    if wanted is None:
        return None if account.is_superuser else f"{method} here is open to superusers only"
    missing = missing_permissions(account, wanted)
    if not missing:
        return None
    roles = sorted({role for role, held in shipped_roles().items() if set(missing) <= set(held)})
    where = f" (the {' or '.join(repr(r) for r in roles)} group holds it)" if roles else ""
    return f"you lack the permission {', '.join(missing)}, which {method} here needs{where}; ask an administrator"


def missing_permissions(account: Account, wanted: Iterable[str]) -> list[str]:
    """The permissions of ``wanted`` the account does not hold, in the order given."""
    return [perm for perm in wanted if not account.has_perm(perm)]


def _doors_of(apps: tuple[str, ...], methods: Iterable[str] | None = None) -> set[str]:
    """Every permission a door needs whose permissions all lie in ``apps`` (reads only, with ``methods``)."""
    found: set[str] = set()
    for (_name, method), perms in DOORS.items():
        if perms and all(p.split(".")[0] in apps for p in perms) and (methods is None or method in methods):
            found.update(perms)
    return found


def _models(apps: tuple[str, ...], actions: tuple[str, ...], models: dict[str, list[str]]) -> set[str]:
    return {f"{app}.{action}_{model}" for app in apps for model in models.get(app, []) for action in actions}


def roles(models: dict[str, list[str]]) -> dict[str, frozenset[str]]:
    """The shipped groups and their permissions, given each app's model names (lower case).

    - **viewers** see the fleet: every page and every read of the API but
      keys, budgets and usage, and nothing they can change.
    - **operators** run the fleet: what viewers see, and every change to the
      fleet's and the catalog's records (in the API, the console and the
      admin), but not keys, budgets or usage.
    - **finance** runs the tenancy: teams, keys, prices, budgets and usage.
    """
    viewers = _doors_of(FLEET_APPS, READS) | _models(FLEET_APPS, ("view",), models) | set(EVERY_ROLE)
    operators = viewers | _doors_of(FLEET_APPS) | _models(FLEET_APPS, ("add", "change", "delete"), models)
    finance = _doors_of(FINANCE_APPS) | _models(FINANCE_APPS, ("view", "add", "change"), models) | set(EVERY_ROLE)
    return {"viewers": frozenset(viewers), "operators": frozenset(operators), "finance": frozenset(finance)}


@functools.cache
def shipped_roles() -> dict[str, frozenset[str]]:
    """:func:`roles` of the installed models: the groups ``migrate`` creates and ``llmgw roles`` keeps."""
    return roles(
        {
            label: [m._meta.model_name for m in django_apps.get_app_config(label).get_models()]
            for label in (*FLEET_APPS, *FINANCE_APPS)
        }
    )
