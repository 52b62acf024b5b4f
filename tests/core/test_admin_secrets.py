"""A secret minted in the admin is shown once, on the page, and never travels in a cookie.

Django's default message storage keeps a message in a cookie when it fits:
the page that tells Olive her new API token, gateway key or join token would
then send the secret back in ``Set-Cookie`` (signed, not encrypted), and on a
listener served over plain HTTP every proxy and browser cache on the way
would hold it. The messages live in the session instead (llmgw/settings.py),
whose cookie is an opaque id.
"""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import User
from django.contrib.messages.storage.cookie import CookieStorage
from django.test import Client, RequestFactory
from django.urls import reverse

from core.credentials import hash_token
from core.models import ApiToken
from gateway.models import ApiKey, Organisation, Team
from inventory.models import JoinToken

pytestmark = pytest.mark.django_db
SHOWN = re.compile(r"is (\S+) — copy it now")


@pytest.fixture
def olive() -> Client:
    client = Client()
    client.force_login(User.objects.create_superuser("olive", password="x" * 12))
    return client


def _api_token(client: Client) -> tuple[str, dict, type]:
    owner = User.objects.get(username="olive")
    return "admin:core_apitoken_add", {"user": owner.pk, "name": "ctl", "read_only": ""}, ApiToken


def _gateway_key(client: Client) -> tuple[str, dict, type]:
    team = Team.objects.create(org=Organisation.objects.create(name="acme"), name="search")
    return "admin:gateway_apikey_add", {"team": team.pk, "name": "crawler", "allowed_models": ""}, ApiKey


def _join_token(client: Client) -> tuple[str, dict, type]:
    return "admin:inventory_jointoken_add", {"name": "rack-a"}, JoinToken


def _cookie_texts(response) -> list[str]:
    """Every cookie the response sets, raw and, for a messages cookie, as its messages read."""
    texts = []
    for name, morsel in response.cookies.items():
        texts.append(morsel.OutputString())
        if name == CookieStorage.cookie_name:
            decoded = CookieStorage(RequestFactory().get("/"))._decode(morsel.value)
            texts.append(" ".join(str(message) for message in decoded or []))
    return texts


@pytest.mark.parametrize("minted", [_api_token, _gateway_key, _join_token], ids=["api-token", "gateway-key", "join"])
def test_a_minted_secret_is_shown_on_the_page_and_never_set_in_a_cookie(olive, minted):
    url, form, model = minted(olive)
    posted = olive.post(reverse(url), form)
    assert posted.status_code == 302, posted.content.decode()[:2000]
    shown = olive.get(posted["Location"])
    (secret,) = SHOWN.findall(shown.content.decode())
    assert model.objects.get().digest == hash_token(secret)  # the very secret, shown once
    for response in (posted, shown):
        assert not [text for text in _cookie_texts(response) if secret in text]
        assert CookieStorage.cookie_name not in response.cookies
    # Shown once: the next page no longer carries it.
    assert secret not in olive.get(posted["Location"]).content.decode()
