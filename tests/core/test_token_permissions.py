"""Who may mint an API token for whom, in the admin: four people.

- Sam is a superuser: he may mint a token for anyone.
- Stella is staff allowed to add and change API tokens, and no superuser: she may mint for
  herself and for other people who are not superusers — never for Sam, since a token acts
  with its owner's powers, and never by moving a token she minted onto Sam.
- Nora is an ordinary account (a script's): tokens may be minted for her.
- Victor is staff with view permissions only: he mints nothing.
"""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.urls import reverse
from hypothesis import given
from hypothesis import strategies as st

from core.credentials import may_issue_token
from core.models import ApiToken

pytestmark = pytest.mark.django_db
ADD = reverse("admin:core_apitoken_add")


def logged_in(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def sam(db) -> User:
    return User.objects.create_superuser("sam", password="x" * 12)


@pytest.fixture
def stella(db) -> User:
    user = User.objects.create_user("stella", password="x" * 12, is_staff=True)
    user.user_permissions.set(
        Permission.objects.filter(codename__in=["add_apitoken", "change_apitoken", "view_apitoken", "view_user"])
    )
    return user


@pytest.fixture
def nora(db) -> User:
    return User.objects.create_user("nora")


@pytest.fixture
def victor(db) -> User:
    user = User.objects.create_user("victor", password="x" * 12, is_staff=True)
    user.user_permissions.set(Permission.objects.filter(codename__startswith="view_"))
    return user


def mint(client: Client, owner: User, name: str = "ctl") -> int:
    return client.post(ADD, {"user": owner.pk, "name": name, "read_only": ""}).status_code


def test_stella_mints_for_herself_and_for_nora(stella, nora):
    client = logged_in(stella)
    assert mint(client, stella) == 302 and mint(client, nora) == 302
    assert sorted(ApiToken.objects.values_list("user__username", flat=True)) == ["nora", "stella"]


def test_stella_cannot_mint_for_a_superuser(stella, sam):
    client = logged_in(stella)
    assert mint(client, sam) == 200  # the form again, with the refusal
    assert not ApiToken.objects.exists()


def test_the_form_offers_stella_no_superuser(stella, sam, nora):
    page = logged_in(stella).get(ADD).content.decode()
    assert f'value="{nora.pk}"' in page and f'value="{sam.pk}"' not in page


def test_sam_mints_for_anyone(sam, stella):
    client = logged_in(sam)
    assert mint(client, sam) == 302 and mint(client, stella) == 302
    assert ApiToken.objects.filter(user=sam).exists()


def test_stella_cannot_move_her_token_onto_sam(stella, sam):
    token, _ = ApiToken.issue(stella, "mine")
    change = reverse("admin:core_apitoken_change", args=[token.pk])
    logged_in(stella).post(change, {"user": sam.pk, "name": "mine", "read_only": ""})
    token.refresh_from_db()
    assert token.user == stella


def test_stella_cannot_change_sams_token(stella, sam):
    token, _ = ApiToken.issue(sam, "sam's", read_only=True)
    change = reverse("admin:core_apitoken_change", args=[token.pk])
    assert logged_in(stella).post(change, {"name": "sam's", "read_only": ""}).status_code == 403
    token.refresh_from_db()
    assert token.read_only


def test_victor_mints_nothing(victor, nora):
    assert mint(logged_in(victor), nora) == 403
    assert not ApiToken.objects.exists()


class Person:
    def __init__(self, superuser: bool) -> None:
        self.is_superuser = superuser


@given(st.booleans(), st.booleans())
def test_the_rule_only_a_superuser_mints_for_a_superuser(issuer_super, owner_super):
    allowed = may_issue_token(Person(issuer_super), Person(owner_super)) is None
    assert allowed == (issuer_super or not owner_super)
