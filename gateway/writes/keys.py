"""API keys: made at random, shown once, kept as their SHA-256, looked up by it.

Stored as every secret llmgw issues is (``core.credentials``: the policy and
its reasons): a key is 256 random bits, so its plain SHA-256 is enough, and
it needs no secret of the server's, so every host of a multi-host control
plane knows every key with nothing to share but the database.

Keys are looked up by their digest (a unique index), then the stored digest
is compared with ``core.credentials.same_digest``.

Keys issued before that policy were stored as an HMAC under a secret kept
out of the database (``LLMGW_GATEWAY_KEY_SECRET``, its ``_FILE`` form, or
``gateway-key-secret`` in the data dir). Such a key still works: where that
old secret is still there, a key that is not found by its SHA-256 is looked
for by its HMAC, and found, is stored anew as its SHA-256
(``upgrade_legacy``), so it is read by the one policy from then on. Nothing
makes that secret any more; once no key is stored under it (every old key
used once, or revoked), it can be deleted.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from dataclasses import dataclass
from functools import cache

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from core.config import secret_from_env_or_file
from core.credentials import hash_token, random_secret, same_digest
from gateway.models import ApiKey, Budget, Organisation, Team
from gateway.rules import Caller

LEGACY_SECRET_FILE = "gateway-key-secret"
"""Where the HMAC release generated its key secret, in the data dir (read, never written)."""
KEY_PREFIX = "sk-llmgw-"
PREFIX_CHARS = len(KEY_PREFIX) + 6
DEFAULT_ORG = "default"


def new_key() -> str:
    return KEY_PREFIX + random_secret()


@cache
def legacy_secret() -> bytes | None:
    """The secret keys were once stored under (an HMAC), where one is still set or in the data dir; else None.

    Only read, never made: a fresh install has none, and never looks for old keys.
    """
    secret = secret_from_env_or_file(dict(os.environ), "LLMGW_GATEWAY_KEY_SECRET")
    if secret:
        return secret.encode()
    path = settings.DATA_DIR / LEGACY_SECRET_FILE
    old = path.read_text().strip() if path.exists() else ""
    return old.encode() if old else None


def upgrade_legacy(secret: str) -> None:
    """Store a key kept as its HMAC under ``legacy_secret`` as its SHA-256 instead; nothing when there is none.

    The caller looks the key up again by its SHA-256 afterwards, whether this
    request rewrote it or another one did at the same moment.
    """
    old = legacy_secret()
    if old is not None:
        was = hmac.new(old, secret.encode(), hashlib.sha256).hexdigest()
        ApiKey.objects.filter(digest=was).update(digest=hash_token(secret))


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


MODEL_NAME_CHARS = 128
"""The longest model name or alias the catalog stores (catalog.models' name columns)."""
MODELS_SENTENCE = "models must be a list of model names (an alias or the model's name), or left out for every model"


def _decoded(value):
    """A string that holds a JSON list (a form's text, or a double-encoding client) is that list."""
    if isinstance(value, str) and value.lstrip().startswith("["):
        try:
            inner = json.loads(value)
        except ValueError:
            return value
        if isinstance(inner, list):
            return inner
    return value


def model_names(value) -> tuple[str, ...] | None:
    """The models a key may use, from its stored ``allowed_models``: the one reading of that column.

    None (SQL or JSON null): every model. A list: its names; an element
    that is not a string names nothing. A string holding a JSON list (how a
    double-encoded list lands): that list. Anything else (another string, an
    object, a number): no model at all — a value nobody meant is read as the
    narrowest one, never as "every model". Both admission paths read the
    column through this (``caller_from_row``), and writes store only what it
    reads as written (``models_for_storage``).
    """
    value = _decoded(value)
    if value is None:
        return None
    if isinstance(value, list):
        return tuple(v for v in value if isinstance(v, str) and v)
    return ()


def models_for_storage(value) -> list[str] | None:
    """What to store in ``allowed_models`` for a key given ``value``: a list of names, or None for every model.

    Read as ``model_names`` reads it, but stricter: what it would read as
    no model, or a name that is not a non-empty string a catalog name column
    could hold, is refused (400) with the element's position, rather than
    stored to mean nothing.
    """
    value = _decoded(value)
    if value is None:
        return None
    if not isinstance(value, list):
        raise KeyRefused(MODELS_SENTENCE)
    names: list[str] = []
    for i, name in enumerate(value):
        if not isinstance(name, str) or not name or len(name) > MODEL_NAME_CHARS or "\x00" in name:
            raise KeyRefused(f"models[{i}]: {MODELS_SENTENCE}; a name is 1 to {MODEL_NAME_CHARS} characters, no NUL")
        if name not in names:
            names.append(name)
    return names


@transaction.atomic
def issue(*, team: str, org: str | None = None, models=None, name: str = "") -> Issued:
    """A new key for ``team``; ``models`` as ``models_for_storage`` takes it."""
    if not team or not isinstance(team, str):
        raise KeyRefused("a key needs a team: send {'team': 'NAME'}")
    models = models_for_storage(models)
    secret = new_key()
    key = ApiKey.objects.create(
        team=team_for(team, org),
        name=name,
        prefix=secret[:PREFIX_CHARS],
        digest=hash_token(secret),
        allowed_models=models,
    )
    return Issued(key=key, secret=secret)


def revoke(key: ApiKey) -> ApiKey:
    """Revoke now; a key revoked already keeps its first revocation time."""
    if key.revoked_at is None:
        ApiKey.objects.filter(pk=key.pk, revoked_at__isnull=True).update(revoked_at=timezone.now())
        key.refresh_from_db(fields=["revoked_at"])
    return key


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
        # allowed_models as its JSON text: psycopg decodes jsonb itself where
        # Django's cursors leave it text, and a JSON string would then read two
        # ways. As text, both paths decode it once, in caller_from_row.
        "SELECT k.id, k.digest, k.revoked_at, k.team_id, t.org_id, CAST(k.allowed_models AS text), "
        "k.rpm, k.tpm, t.rpm, t.tpm, "
        f"(SELECT b.id FROM {budget} b WHERE b.key_id = k.id), "
        f"(SELECT b.id FROM {budget} b WHERE b.team_id = k.team_id), "
        f"(SELECT b.id FROM {budget} b WHERE b.org_id = t.org_id) "
        f"FROM {key} k JOIN {team} t ON t.id = k.team_id WHERE k.digest = %(digest)s"
    )


NO_KEY = "no API key: send 'Authorization: Bearer sk-llmgw-…'"


def caller_from_row(row, wanted: str) -> tuple[Caller | None, str]:
    """What ``lookup_sql`` found for the digest ``wanted``: the caller, or None with the sentence for a 401."""
    if row is None or not same_digest(row[1], wanted):
        return None, "this API key is not known: check it was copied whole"
    if row[2] is not None:
        return None, "this API key has been revoked: ask for a new one"
    budgets = tuple(b for b in row[10:13] if b is not None)
    return Caller(
        key_id=row[0],
        team_id=row[3],
        org_id=row[4],
        allowed_models=_allowed_column(row[5]),
        key_rpm=row[6],
        key_tpm=row[7],
        team_rpm=row[8],
        team_tpm=row[9],
        budget_ids=budgets,
    ), ""


def _allowed_column(text: str | None) -> tuple[str, ...] | None:
    """``model_names`` of the column's JSON text; text that is not JSON (never written so) allows nothing."""
    if text is None:
        return None
    try:
        return model_names(json.loads(text))
    except ValueError:
        return ()


def authenticate(secret: str) -> tuple[Caller | None, str]:
    """The caller behind a key, or None with the sentence to answer 401 with.

    Read from the database on every request, never from a cache: a revoked
    key must stop working on every gateway process at once.
    """
    if not secret:
        return None, NO_KEY
    wanted = hash_token(secret)
    row = _looked_up(wanted)
    if row is None and legacy_secret() is not None:
        upgrade_legacy(secret)
        row = _looked_up(wanted)
    return caller_from_row(row, wanted)


def _looked_up(wanted: str):
    with connection.cursor() as cursor:
        cursor.execute(lookup_sql(), {"digest": wanted})
        return cursor.fetchone()
