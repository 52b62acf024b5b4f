"""``llmgw roles [--sync | --reset]``: the groups llmgw ships, and what each may do.

1. Without a flag: create a shipped group that is missing, keep the others.
2. ``--sync``: also add to each group what this llmgw gives it (after an upgrade).
3. ``--reset``: make each group exactly what llmgw ships.
4. Print each group with the permissions it holds now.
"""

from __future__ import annotations

from django.contrib.auth.models import Group
from django.core.management.base import BaseCommand

from core import roles


class Command(BaseCommand):
    help = "Create (or --sync, --reset) the groups llmgw ships: viewers, operators, finance."

    def add_arguments(self, parser):
        how = parser.add_mutually_exclusive_group()
        how.add_argument("--sync", action="store_true", help="add what this version gives each group")
        how.add_argument("--reset", action="store_true", help="make each group exactly what llmgw ships")

    def handle(self, *args, sync: bool, reset: bool, **options):
        done = roles.ensure(roles.RESET if reset else roles.SYNC if sync else roles.CREATE)
        for name, what in done.items():
            group = Group.objects.get(name=name)
            perms = sorted(f"{p.content_type.app_label}.{p.codename}" for p in group.permissions.all())
            self.stdout.write(f"{name} ({what}): {len(perms)} permissions")
            for perm in perms:
                self.stdout.write(f"  {perm}")
