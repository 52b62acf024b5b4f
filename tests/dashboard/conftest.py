"""The console's personas: an operator, a colleague without staff rights, and nobody.

Every permission test reads as one of them opening a page or a socket.
"""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from tests import people


@pytest.fixture
def olivia(db):
    """Olivia runs the fleet: an operator's account (tests/people.py), logged in."""
    return people.operator("olivia", password="x")


@pytest.fixture
def operator(olivia) -> Client:
    client = Client()
    client.force_login(olivia)
    return client


@pytest.fixture
def colleague(db) -> Client:
    """Carl has an account (he uses the gateway) but is not staff: the admin is not his."""
    client = Client()
    client.force_login(get_user_model().objects.create_user("carl", password="x"))
    return client


@pytest.fixture
def nobody() -> Client:
    return Client()
