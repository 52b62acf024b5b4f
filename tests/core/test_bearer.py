"""One reading of ``Authorization: Bearer <secret>`` for every door: the admin API, the agents' two lanes, the gateway.

The specification: the scheme ``bearer`` in any case, then a space, then the
secret with white space around it stripped; anything else (another scheme,
no space, an empty secret) carries no bearer secret.
"""

from __future__ import annotations

from unittest import mock

import pytest
from django.test import RequestFactory
from hypothesis import given
from hypothesis import strategies as st
from rest_framework import exceptions
from rest_framework.request import Request

from agentapi import auth as agent_auth
from core.auth import BearerTokenAuthentication
from core.credentials import bearer_secret
from gateway.asgi import _bearer

LATIN1 = st.text(st.characters(max_codepoint=255, exclude_characters="\r\n\x00"), max_size=12)
SCHEMES = st.sampled_from(["Bearer", "bearer", "BEARER", "Basic", "Token", "", "Bear"])
HEADERS = st.one_of(
    st.builds(lambda s, sep, secret: s + sep + secret, SCHEMES, st.sampled_from([" ", "", "  "]), LATIN1), LATIN1
)


def specification(header: str) -> str | None:
    scheme, space, rest = header.partition(" ")
    return rest.strip() or None if space and scheme.lower() == "bearer" else None


@given(HEADERS)
def test_the_one_reading_is_the_specification(header):
    assert bearer_secret(header) == specification(header)


@given(HEADERS)
def test_the_gateway_and_the_agents_read_it_alike(header):
    expected = specification(header)
    assert _bearer([(b"authorization", header.encode("latin-1"))]) == (expected or "")
    request = RequestFactory().get("/", HTTP_AUTHORIZATION=header)
    if expected is None:
        with pytest.raises(agent_auth.Refused):
            agent_auth.bearer(request)
    else:
        assert agent_auth.bearer(request) == expected


class Looked(Exception):
    """The authenticator got as far as looking a secret up."""


@given(HEADERS)
def test_the_admin_api_looks_up_exactly_the_secret_the_reading_finds(header):
    expected = specification(header)
    request = Request(RequestFactory().get("/", HTTP_AUTHORIZATION=header))
    with mock.patch("core.auth.hash_token", side_effect=Looked) as looked:
        try:
            BearerTokenAuthentication().authenticate(request)
        except Looked:
            pass
        except exceptions.AuthenticationFailed:
            # "Bearer" with nothing after it: said, rather than passed to the session's authenticator.
            assert expected is None and header.partition(" ")[0].lower() == "bearer"
    assert [c.args[0] for c in looked.call_args_list] == ([expected] if expected is not None else [])
