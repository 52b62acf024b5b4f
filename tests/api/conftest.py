"""The admin API's personas: an operator's token, a read-only token, and nobody.

Every permission test reads as one of them trying something.
"""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from tests import people
from tests.people import person, token_of


def client_with(token: str | None) -> APIClient:
    client = APIClient()
    if token:
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return client


@pytest.fixture
def operator(db) -> APIClient:
    """Olivia runs the fleet: her token may change things."""
    return client_with(token_of(people.operator("olivia"), name="ctl on olivia's laptop"))


@pytest.fixture
def reader(db) -> APIClient:
    """Rui watches dashboards: a viewer (and finance, for usage) whose token may only read."""
    return client_with(token_of(person("rui", "viewers", "finance"), read_only=True, name="grafana"))


@pytest.fixture
def nobody(db) -> APIClient:
    """Someone on the network without a token."""
    return client_with(None)
