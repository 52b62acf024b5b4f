"""A key's model list reads one way on both admission paths, and is stored only as it reads.

``allowed_models`` is a JSON column; what was written there by hand, by a
form or by a client that encoded its list twice is read by one function
(gateway.writes.keys.model_names) whichever path admits the request.
"""

from __future__ import annotations

import pytest
from django.utils import timezone

from gateway import admission
from gateway.admin import ApiKeyForm
from gateway.models import ApiKey, Budget
from gateway.rules import Ask
from gateway.writes import keys
from tests.gateway.test_pgpath import on_loop, outcome

pytestmark = pytest.mark.django_db(transaction=True)

STORED = [
    (None, True),
    (["a"], True),
    (["b", "a"], True),
    (["a", 1, None], True),
    ('["a"]', True),  # a list encoded twice: a JSON string holding it
    ("a", False),  # a bare string is not a list of names: nothing
    ({"a": 1}, False),
    (5, False),
    ([], False),
    (["b"], False),
    ("[not json", False),
]


@pytest.mark.parametrize(("stored", "allowed"), STORED)
def test_both_paths_read_a_stored_model_list_alike_and_never_hold_a_refused_reservation(stored, allowed):
    issued = keys.issue(team="search", org="acme")
    ApiKey.objects.filter(pk=issued.key.pk).update(allowed_models=stored)
    budget = Budget.objects.create(scope="key", key=issued.key, amount_micros=1_000)
    now = timezone.now()
    args = (issued.secret, Ask("a", "a", (), 10, True, now))

    by_orm = outcome(admission.admit(*args))
    Budget.objects.update(reserved_micros=0)
    on_the_loop = outcome(on_loop(lambda pg: pg.admit(*args)))

    assert on_the_loop == by_orm
    refused = by_orm[1]
    if allowed:
        assert refused is None and by_orm[2] == ((budget.id, 10),)
    else:
        assert refused[:2] == (403, "model_not_allowed") and by_orm[2] == ()
        assert Budget.objects.get().reserved_micros == 0


def test_a_stored_bare_string_is_a_403_on_the_loop_not_a_500_with_its_reservation_held():
    # The report: the SQL matched the string "a" as a name and reserved; the
    # Python side then failed to read it.
    issued = keys.issue(team="search", org="acme")
    ApiKey.objects.filter(pk=issued.key.pk).update(allowed_models="a")
    Budget.objects.create(scope="key", key=issued.key, amount_micros=1_000)
    result = on_loop(lambda pg: pg.admit(issued.secret, Ask("a", "a", (), 10, True, timezone.now())))
    assert result.refused.status == 403
    assert Budget.objects.get().reserved_micros == 0


@pytest.mark.parametrize(
    ("given", "stored"),
    [(None, None), (["a", "b", "a"], ["a", "b"]), ('["a"]', ["a"]), ([], [])],
)
def test_writes_store_the_list_as_it_is_read(given, stored):
    key = keys.issue(team="search", models=given).key
    key.refresh_from_db()
    assert key.allowed_models == stored


@pytest.mark.parametrize(
    ("given", "sentence"),
    [
        ("a", "models must be a list"),
        ({"a": 1}, "models must be a list"),
        (["a", 1], "models[1]:"),
        (["a", ""], "models[1]:"),
        (["a\x00b"], "models[0]:"),
        (["x" * 129], "models[0]:"),
        ('["a", 2]', "models[1]:"),
    ],
)
def test_writes_refuse_what_would_read_as_nothing_and_store_nothing(given, sentence):
    with pytest.raises(keys.KeyRefused) as refused:
        keys.issue(team="search", models=given)
    assert refused.value.status == 400 and sentence in refused.value.message
    assert not ApiKey.objects.exists()


def test_the_admin_form_stores_the_list_as_it_is_read():
    team = keys.team_for("search", "acme")
    twice = ApiKeyForm(data={"team": team.pk, "name": "", "allowed_models": '"[\\"a\\"]"'})
    assert twice.is_valid(), twice.errors
    assert twice.cleaned_data["allowed_models"] == ["a"]
    bare = ApiKeyForm(data={"team": team.pk, "name": "", "allowed_models": '"a"'})
    assert not bare.is_valid() and "models must be a list" in str(bare.errors["allowed_models"])
