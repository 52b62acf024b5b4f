"""The people of the permission tests: accounts in the groups llmgw ships.

- an **operator** (groups operators and finance) may do everything the API offers;
- a **viewer** (group viewers) sees the fleet and changes nothing;
- **finance** (group finance) runs keys, budgets and usage, and sees nothing of the fleet;
- an account made with no group holds nothing: staff or not, every door is shut to it.
"""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group

from core import roles
from core.models import ApiToken

OPERATOR = ("operators", "finance")


def person(name: str, *groups: str, staff: bool = True, **fields):
    """An account in ``groups`` (the shipped ones are made first if a flush removed them)."""
    roles.ensure()
    user = get_user_model().objects.create_user(name, is_staff=staff, **fields)
    user.groups.set(Group.objects.filter(name__in=groups))
    return user


def operator(name: str = "olivia", **fields):
    """An account that may do anything the admin API and the console offer, without being a superuser."""
    return person(name, *OPERATOR, **fields)


def token_of(user, *, read_only: bool = False, name: str = "ctl") -> str:
    """A fresh API token's secret for ``user``."""
    return ApiToken.issue(user, name, read_only=read_only)[1]
