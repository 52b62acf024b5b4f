"""``llmgw token create``: a token printed once, stored hashed, read-only when asked."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from core.credentials import hash_token
from core.models import ApiToken
from tests import people
from tests.api.conftest import client_with

pytestmark = pytest.mark.django_db


def create(*args: str) -> str:
    out, err = StringIO(), StringIO()
    call_command("token", "create", *args, stdout=out, stderr=err)
    assert "shown once" in err.getvalue()
    return out.getvalue().strip()


def test_a_token_is_printed_once_and_stored_only_as_its_hash(db):
    people.operator("ci")
    secret = create("--user", "ci", "--name", "nightly bench")
    token = ApiToken.objects.get()
    assert token.digest == hash_token(secret) and secret not in (token.hint, token.name, token.digest)
    assert token.name == "nightly bench" and not token.read_only
    assert client_with(secret).post("/api/v1/weights/collect", {}, format="json").status_code == 200


def test_a_read_only_token_reads_but_cannot_change(db):
    people.person("grafana", "viewers")
    secret = create("--user", "grafana", "--read-only")
    client = client_with(secret)
    assert client.get("/api/v1/summary").status_code == 200
    assert client.post("/api/v1/weights/collect", {}, format="json").status_code == 403


def test_an_unknown_account_is_refused_with_how_to_make_one(db):
    with pytest.raises(CommandError, match="createsuperuser"):
        call_command("token", "create", "--user", "ghost", stdout=StringIO(), stderr=StringIO())
    assert not ApiToken.objects.exists()


def test_a_token_for_an_account_with_no_permission_says_it_opens_nothing(db):
    people.person("intern")
    err = StringIO()
    secret = call_command("token", "create", "--user", "intern", stdout=StringIO(), stderr=err) or ""
    assert "opens nothing yet" in err.getvalue()
    assert ApiToken.objects.filter(user__username="intern").exists() and secret == ""
