"""The admin API's personas: an operator's token, a read-only token, and nobody.

Every permission test reads as one of them trying something.
"""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from rest_framework.test import APIClient

from core.models import ApiToken


def client_with(token: str | None) -> APIClient:
    client = APIClient()
    if token:
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return client


@pytest.fixture
def operator(db) -> APIClient:
    """Olivia runs the fleet: her token may change things."""
    user = get_user_model().objects.create_user("olivia")
    _, secret = ApiToken.issue(user, "ctl on olivia's laptop")
    return client_with(secret)


@pytest.fixture
def reader(db) -> APIClient:
    """Rui watches dashboards: his token may only read."""
    user = get_user_model().objects.create_user("rui")
    _, secret = ApiToken.issue(user, "grafana", read_only=True)
    return client_with(secret)


@pytest.fixture
def nobody(db) -> APIClient:
    """Someone on the network without a token."""
    return client_with(None)
