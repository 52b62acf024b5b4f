"""Who may mint an API token for whom, in the admin: four people.

- Sam is a superuser: he may mint a token for anyone.
- Stella is staff allowed to add and change API tokens, and no superuser: she may mint for
  herself and for other people who are not superusers — never for Sam, since a token acts
  with its owner's powers, and never by moving a token she minted onto Sam.
- Nora is an ordinary account (a script's): tokens may be minted for her.
- Victor is staff with view permissions only: he mints nothing.
- Olivia is an operator (the shipped group): she holds permissions Stella lacks, so Stella may not
  mint her a token — it would let Stella act as Olivia.
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
def olivia(db) -> User:
    from django.contrib.auth.models import Group

    from core import roles

    roles.ensure()
    user = User.objects.create_user("olivia", is_staff=True)
    user.groups.add(Group.objects.get(name="operators"))
    return user


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


def test_stella_cannot_mint_for_an_operator_who_holds_more_than_she_does(stella, olivia):
    client = logged_in(stella)
    page = client.post(ADD, {"user": olivia.pk, "name": "olivia's", "read_only": ""})
    assert page.status_code == 200 and "holds permissions you do not" in page.content.decode()
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
    def __init__(self, pk: int, superuser: bool, perms: set[str]) -> None:
        self.pk, self.is_superuser, self.perms = pk, superuser, perms

    def get_all_permissions(self, obj=None) -> set[str]:
        return set(self.perms)


PERMS = st.sets(st.sampled_from(["a.view_x", "a.add_x", "b.change_y", "b.delete_y"]))


@given(st.booleans(), st.booleans(), PERMS, PERMS, st.booleans())
def test_the_rule_a_token_never_carries_more_than_its_issuer_holds(
    issuer_super, owner_super, issuer_perms, owner_perms, same
):
    issuer = Person(1, issuer_super, issuer_perms)
    owner = issuer if same else Person(2, owner_super, owner_perms)
    allowed = may_issue_token(issuer, owner) is None
    assert allowed == (issuer_super or same or (not owner_super and owner_perms <= issuer_perms))
