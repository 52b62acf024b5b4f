"""API keys: made at random, shown once, kept as an HMAC, looked up in constant time.

The HMAC's secret is not in the database (``LLMGW_GATEWAY_KEY_SECRET``, its
``_FILE`` form, or a file generated once in the data dir), so a copy of the
database alone cannot be used to test guesses of keys. Every host of a
multi-host control plane must share it: set the variable there, or every key
issued elsewhere is unknown.

Keys are looked up by their digest (a unique index), then the stored digest
is compared with ``hmac.compare_digest``: the index lookup reveals nothing an
attacker can use, because the digest of a guess is not something they can
steer byte by byte.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
from dataclasses import dataclass
from functools import cache

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from gateway.models import ApiKey, Budget, Organisation, Team
from llmgw.config import secret_from_env_or_file, write_private_file

KEY_SECRET_FILE = "gateway-key-secret"
KEY_PREFIX = "sk-llmgw-"
PREFIX_CHARS = len(KEY_PREFIX) + 6
DEFAULT_ORG = "default"


@cache
def key_secret() -> bytes:
    """The HMAC secret: from the environment, else from (or into) the data dir."""
    secret = secret_from_env_or_file(dict(os.environ), "LLMGW_GATEWAY_KEY_SECRET")
    if secret:
        return secret.encode()
    path = settings.DATA_DIR / KEY_SECRET_FILE
    if path.exists() and path.read_text().strip():
        return path.read_text().strip().encode()
    value = secrets.token_urlsafe(48)
    # Two processes starting at once could both generate; O_EXCL lets one win
    # and the other read the winner's, so they never disagree.
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return path.read_text().strip().encode()
    os.close(fd)
    write_private_file(path, value)
    return value.encode()


def digest(key: str) -> str:
    return hmac.new(key_secret(), key.encode(), hashlib.sha256).hexdigest()


def new_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


class KeyRefused(Exception):
    """A key request that cannot be met; ``message`` says what to fix, ``status`` the HTTP answer."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


def team_for(team: str, org: str | None) -> Team:
    """The named team, created (with its organisation) when it does not exist yet.

    A team that exists under another organisation than the one named is a
    conflict, not a silent move: keys, budgets and usage hang off it.
    """
    existing = Team.objects.select_related("org").filter(name=team).first()
    if existing is not None:
        if org and existing.org.name != org:
            raise KeyRefused(f"team {team!r} belongs to organisation {existing.org.name!r}, not {org!r}", 409)
        return existing
    organisation, _ = Organisation.objects.get_or_create(name=org or DEFAULT_ORG)
    return Team.objects.create(org=organisation, name=team)


@dataclass
class Issued:
    key: ApiKey
    secret: str
    """The key itself, which is not stored anywhere: show it once."""


@transaction.atomic
def issue(*, team: str, org: str | None = None, models: list[str] | None = None, name: str = "") -> Issued:
    if not team or not isinstance(team, str):
        raise KeyRefused("a key needs a team: send {'team': 'NAME'}")
    if models is not None and (not isinstance(models, list) or not all(isinstance(m, str) and m for m in models)):
        raise KeyRefused("models must be a list of model names, or left out for every model")
    secret = new_key()
    key = ApiKey.objects.create(
        team=team_for(team, org),
        name=name,
        prefix=secret[:PREFIX_CHARS],
        digest=digest(secret),
        allowed_models=models,
    )
    return Issued(key=key, secret=secret)


def revoke(key: ApiKey) -> ApiKey:
    """Revoke now; a key revoked already keeps its first revocation time."""
    if key.revoked_at is None:
        ApiKey.objects.filter(pk=key.pk, revoked_at__isnull=True).update(revoked_at=timezone.now())
        key.refresh_from_db(fields=["revoked_at"])
    return key


@dataclass(frozen=True)
class Caller:
    """Who a request comes from, as the gateway needs it on every request."""

    key_id: str
    team_id: int
    org_id: int
    allowed_models: tuple[str, ...] | None
    key_rpm: int | None
    key_tpm: int | None
    team_rpm: int | None
    team_tpm: int | None
    budget_ids: tuple[int, ...] = ()
    """The budgets over this key: its own, its team's, its organisation's, where set."""


def lookup_sql() -> str:
    """The key, its team's organisation and limits, and the budget ids over it, in one query.

    Written out rather than left to the ORM: the ORM's six-way join of the
    three budget relations took PostgreSQL 2 ms to plan on every request,
    this form 0.1 ms, and the ORM's own compiling cost as much again. The
    gateway's PostgreSQL fast path (gateway.pgpath) runs the same text.
    """
    q = connection.ops.quote_name
    key, team, budget = q(ApiKey._meta.db_table), q(Team._meta.db_table), q(Budget._meta.db_table)
    return (
        "SELECT k.id, k.digest, k.revoked_at, k.team_id, t.org_id, k.allowed_models, k.rpm, k.tpm, t.rpm, t.tpm, "
        f"(SELECT b.id FROM {budget} b WHERE b.key_id = k.id), "
        f"(SELECT b.id FROM {budget} b WHERE b.team_id = k.team_id), "
        f"(SELECT b.id FROM {budget} b WHERE b.org_id = t.org_id) "
        f"FROM {key} k JOIN {team} t ON t.id = k.team_id WHERE k.digest = %(digest)s"
    )


NO_KEY = "no API key: send 'Authorization: Bearer sk-llmgw-…'"


def caller_from_row(row, wanted: str) -> tuple[Caller | None, str]:
    """What ``lookup_sql`` found for the digest ``wanted``: the caller, or None with the sentence for a 401."""
    if row is None or not hmac.compare_digest(row[1], wanted):
        return None, "this API key is not known: check it was copied whole"
    if row[2] is not None:
        return None, "this API key has been revoked: ask for a new one"
    allowed = json.loads(row[5]) if isinstance(row[5], str) else row[5]
    budgets = tuple(b for b in row[10:13] if b is not None)
    return Caller(
        key_id=row[0],
        team_id=row[3],
        org_id=row[4],
        allowed_models=tuple(allowed) if allowed is not None else None,
        key_rpm=row[6],
        key_tpm=row[7],
        team_rpm=row[8],
        team_tpm=row[9],
        budget_ids=budgets,
    ), ""


def authenticate(secret: str) -> tuple[Caller | None, str]:
    """The caller behind a key, or None with the sentence to answer 401 with.

    Read from the database on every request, never from a cache: a revoked
    key must stop working on every gateway process at once.
    """
    if not secret:
        return None, NO_KEY
    wanted = digest(secret)
    with connection.cursor() as cursor:
        cursor.execute(lookup_sql(), {"digest": wanted})
        row = cursor.fetchone()
    return caller_from_row(row, wanted)
