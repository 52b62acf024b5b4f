"""First start: the operator account and the three secrets written to the data dir.

Done once. Later starts find the account and leave everything alone, so
restarting never changes a password or a token somebody already uses.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from pathlib import Path

from django.contrib.auth import get_user_model
from django.db import IntegrityError, transaction

from core.config import write_private_file
from core.credentials import hash_token, hint, new_token
from core.models import ApiToken
from inventory.models import JoinToken

ADMIN_USERNAME = "admin"
FILES = ("admin-password", "admin-token", "join-token")


@dataclass
class Bootstrap:
    """What the first start created; ``written`` is empty on every later start."""

    written: list[Path] = field(default_factory=list)


def issue_join_token(name: str = "default") -> str:
    secret = new_token("llmgw_join")
    JoinToken.objects.create(name=name, digest=hash_token(secret), hint=hint(secret))
    return secret


def first_start(data_dir: Path) -> Bootstrap:
    """Create the operator and the secrets once; a host that loses the race to another does nothing.

    Several control hosts may start together on a fresh database: one creates
    the account, the others find the name taken and leave it alone.
    """
    try:
        return _first_start(data_dir)
    except IntegrityError:
        return Bootstrap()


@transaction.atomic
def _first_start(data_dir: Path) -> Bootstrap:
    User = get_user_model()
    result = Bootstrap()
    if User.objects.filter(username=ADMIN_USERNAME).exists():
        return result

    password = secrets.token_urlsafe(18)
    user = User.objects.create_superuser(username=ADMIN_USERNAME, email="", password=password)
    _, api_token = ApiToken.issue(user, "created at first start")
    join = issue_join_token()
    for name, value in zip(FILES, (password, api_token, join), strict=True):
        path = data_dir / name
        write_private_file(path, value)
        result.written.append(path)
    return result
