"""Keys: random, shown once, kept as their SHA-256 (core.credentials' one policy), refused once revoked."""

from __future__ import annotations

import hashlib
import hmac

import pytest
from django.utils import timezone

from core.credentials import hash_token
from gateway.models import ApiKey, Organisation, Team
from gateway.rules import Ask
from gateway.writes import keys
from tests.gateway.test_pgpath import on_loop

pytestmark = pytest.mark.django_db


def test_a_key_is_stored_only_as_its_sha256_like_every_secret_llmgw_issues():
    issued = keys.issue(team="search", org="acme")
    row = ApiKey.objects.get()
    assert issued.secret.startswith("sk-llmgw-") and len(issued.secret) > 40
    assert issued.secret not in str(row.__dict__)
    # The same digest as admin tokens, join tokens and node credentials: one policy, in core.
    assert row.digest == hash_token(issued.secret) == hashlib.sha256(issued.secret.encode()).hexdigest()
    assert row.prefix == issued.secret[: keys.PREFIX_CHARS]


def test_issuing_and_authenticating_need_no_secret_of_the_servers(settings, monkeypatch):
    """No key secret is made or read: another host, or a restored database, knows every key as it is."""
    monkeypatch.delenv("LLMGW_GATEWAY_KEY_SECRET", raising=False)
    monkeypatch.delenv("LLMGW_GATEWAY_KEY_SECRET_FILE", raising=False)
    keys.legacy_secret.cache_clear()
    issued = keys.issue(team="search")
    assert keys.authenticate(issued.secret)[0].key_id == issued.key.id
    assert not (settings.DATA_DIR / keys.LEGACY_SECRET_FILE).exists()
    assert keys.legacy_secret() is None


@pytest.fixture
def old_secret(settings, monkeypatch):
    """A data dir as a release that stored keys as an HMAC left it: its generated secret file, 0600."""
    monkeypatch.delenv("LLMGW_GATEWAY_KEY_SECRET", raising=False)
    monkeypatch.delenv("LLMGW_GATEWAY_KEY_SECRET_FILE", raising=False)
    path = settings.DATA_DIR / keys.LEGACY_SECRET_FILE
    path.write_text("the-old-release-s-secret\n")
    path.chmod(0o600)
    keys.legacy_secret.cache_clear()
    yield b"the-old-release-s-secret"
    path.unlink()
    keys.legacy_secret.cache_clear()


def issued_before(secret: bytes, *, revoked: bool = False) -> tuple[str, ApiKey]:
    """A key as the HMAC release stored it: its digest the HMAC-SHA256 of the key under ``secret``."""
    issued = keys.issue(team="search", org="acme")
    old = hmac.new(secret, issued.secret.encode(), hashlib.sha256).hexdigest()
    ApiKey.objects.filter(pk=issued.key.pk).update(digest=old)
    if revoked:
        keys.revoke(issued.key)
    return issued.secret, ApiKey.objects.get(pk=issued.key.pk)


def test_a_key_issued_before_the_one_policy_still_authenticates_and_is_stored_anew(old_secret):
    secret, key = issued_before(old_secret)
    caller, why = keys.authenticate(secret)
    assert why == "" and caller.key_id == key.id
    # Rewritten on first use: from now on it is found by the one policy's digest alone.
    assert ApiKey.objects.get(pk=key.pk).digest == hash_token(secret)
    assert keys.authenticate(secret)[0].key_id == key.id


@pytest.mark.django_db(transaction=True)
def test_a_key_issued_before_is_also_known_on_the_event_loop_path(old_secret):
    for step in ("authenticate", "admit"):
        secret, key = issued_before(old_secret)
        if step == "authenticate":
            admitted = on_loop(lambda pg, secret=secret: pg.authenticate(secret))
        else:
            admitted = on_loop(lambda pg, secret=secret: pg.admit(secret, Ask("m", "m", (), 10, True, timezone.now())))
        assert admitted.refused is None and admitted.caller.key_id == key.id, step
        assert ApiKey.objects.get(pk=key.pk).digest == hash_token(secret), step


def test_a_key_issued_before_and_revoked_stays_refused(old_secret):
    secret, _ = issued_before(old_secret, revoked=True)
    caller, why = keys.authenticate(secret)
    assert caller is None and "revoked" in why


def test_an_old_digest_is_only_recognised_with_the_old_secret(monkeypatch):
    """Without the secret it was made under, an HMAC digest is nobody's key: nothing is guessed or rewritten."""
    monkeypatch.delenv("LLMGW_GATEWAY_KEY_SECRET", raising=False)
    monkeypatch.delenv("LLMGW_GATEWAY_KEY_SECRET_FILE", raising=False)
    keys.legacy_secret.cache_clear()
    secret, key = issued_before(b"a-secret-this-host-never-had")
    assert "not known" in keys.authenticate(secret)[1]
    assert ApiKey.objects.get(pk=key.pk).digest != hash_token(secret)


def test_the_old_secret_may_come_from_the_environment(monkeypatch):
    monkeypatch.setenv("LLMGW_GATEWAY_KEY_SECRET", "set-on-every-host")
    keys.legacy_secret.cache_clear()
    try:
        secret, key = issued_before(b"set-on-every-host")
        assert keys.authenticate(secret)[0].key_id == key.id
    finally:
        keys.legacy_secret.cache_clear()


def test_authenticate_knows_the_key_its_team_and_organisation():
    issued = keys.issue(team="search", org="acme", models=["llama"])
    caller, why = keys.authenticate(issued.secret)
    assert why == ""
    assert caller.key_id == issued.key.id and caller.allowed_models == ("llama",)
    assert caller.team_id == Team.objects.get(name="search").id
    assert caller.org_id == Organisation.objects.get(name="acme").id


def test_unknown_missing_and_revoked_keys_are_refused_with_a_sentence():
    issued = keys.issue(team="search")
    assert keys.authenticate("")[1].startswith("no API key")
    assert "not known" in keys.authenticate(issued.secret + "x")[1]
    keys.revoke(issued.key)
    caller, why = keys.authenticate(issued.secret)
    assert caller is None and "revoked" in why


def test_a_team_that_belongs_to_another_organisation_is_a_conflict():
    keys.issue(team="search", org="acme")
    with pytest.raises(keys.KeyRefused) as refused:
        keys.issue(team="search", org="globex")
    assert refused.value.status == 409 and "acme" in refused.value.message
    # Without an organisation the team is found, and a new team lands in "default".
    assert keys.issue(team="search").key.team.org.name == "acme"
    assert keys.issue(team="fresh").key.team.org.name == "default"


def test_revoking_twice_keeps_the_first_time():
    key = keys.issue(team="search").key
    first = keys.revoke(key).revoked_at
    assert keys.revoke(ApiKey.objects.get()).revoked_at == first
