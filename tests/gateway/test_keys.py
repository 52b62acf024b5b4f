"""Keys: random, shown once, kept as an HMAC, refused once revoked."""

from __future__ import annotations

import hashlib

import pytest

from gateway import keys
from gateway.models import ApiKey, Organisation, Team

pytestmark = pytest.mark.django_db


def test_a_key_is_stored_only_as_an_hmac_under_the_gateway_secret():
    issued = keys.issue(team="search", org="acme")
    row = ApiKey.objects.get()
    assert issued.secret.startswith("sk-llmgw-") and len(issued.secret) > 40
    assert issued.secret not in str(row.__dict__)
    assert row.digest == keys.digest(issued.secret)
    # Not a plain hash: the database alone does not let anyone test a guess.
    assert row.digest != hashlib.sha256(issued.secret.encode()).hexdigest()
    assert row.prefix == issued.secret[: keys.PREFIX_CHARS]


def test_the_hmac_secret_is_kept_in_the_data_dir_with_mode_0600(settings):
    keys.key_secret()
    path = settings.DATA_DIR / keys.KEY_SECRET_FILE
    assert path.stat().st_mode & 0o777 == 0o600


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
