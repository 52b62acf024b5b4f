"""The groups llmgw ships (viewers, operators, finance), made real in the database.

What each group holds is core.access's (one table, the doors' own); this
module only writes it. ``migrate`` creates a group that does not exist yet
and leaves an existing one as the operator last edited it; ``llmgw roles
--sync`` adds to each group what a newer llmgw gives it, and ``--reset`` makes
each exactly what llmgw ships, taking away what an operator added.
"""

from __future__ import annotations

from django.apps import apps as django_apps
from django.contrib.auth.management import create_permissions
from django.contrib.auth.models import Group, Permission
from django.db import transaction

from core.access import shipped_roles

CREATE, SYNC, RESET = "create", "sync", "reset"


def _permissions(names: frozenset[str]) -> list[Permission]:
    wanted = {tuple(n.split(".", 1)) for n in names}
    rows = Permission.objects.select_related("content_type").filter(
        content_type__app_label__in={app for app, _ in wanted}, codename__in={code for _, code in wanted}
    )
    return [p for p in rows if (p.content_type.app_label, p.codename) in wanted]


def ensure(mode: str = CREATE, *, verbosity: int = 0) -> dict[str, str]:
    """Create, sync or reset the shipped groups; what was done to each, by name."""
    for config in django_apps.get_app_configs():
        # A fresh database's permissions are made by post_migrate, app by app; make sure all exist first.
        create_permissions(config, verbosity=verbosity)
    done = {}
    with transaction.atomic():
        for name, names in shipped_roles().items():
            group, created = Group.objects.get_or_create(name=name)
            if created or mode == RESET:
                group.permissions.set(_permissions(names))
                done[name] = "created" if created else "reset"
            elif mode == SYNC:
                group.permissions.add(*_permissions(names))
                done[name] = "synced"
            else:
                done[name] = "kept"
    return done


def after_migrate(sender, **kwargs) -> None:
    """post_migrate: the groups a fresh install needs, once; an existing group is the operator's."""
    if sender.label == "core":
        ensure(CREATE)
