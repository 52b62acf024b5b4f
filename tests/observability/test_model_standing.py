"""The summary's models (``model_standing``) are ``model_list``'s entries, key for key, on any catalog.

The summary reads a lean list of the models, without their profiles,
aliases and the rest; here random catalogs (parked or not, any minimum,
replicas in every state, the scheduler's last word placed or not) go
through both, and the summary's counts are those of ``model_list``.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import transaction
from django.utils import timezone
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from catalog.models import CatalogModel
from observability.fleet_summary import _model_totals
from placement.models import PlacementExplanation, Replica, ReplicaState
from placement.reads import STANDING, STANDING_PARKED, model_list, model_standing
from tests.api.fleet import MODEL, add_model

pytestmark = pytest.mark.django_db

MODELS = st.lists(
    st.fixed_dictionaries(
        {
            "min": st.integers(0, 3),
            "parked": st.one_of(
                st.none(),
                st.tuples(
                    st.text(
                        st.characters(codec="utf-8", exclude_categories=("Cs",), exclude_characters="\x00"), max_size=20
                    ),
                    st.integers(0, 9),
                ),
            ),
            "replicas": st.lists(st.sampled_from(ReplicaState.values), max_size=5),
            "explained": st.sampled_from([None, True, False]),
        }
    ),
    max_size=5,
)


def _store(catalog: list[dict]) -> None:
    for i, m in enumerate(catalog):
        model = add_model({**MODEL, "name": f"m{i}", "aliases": [f"a{i}"], "scaling": {"min": m["min"], "max": 5}})
        if m["parked"] is not None:
            error, failures = m["parked"]
            CatalogModel.objects.filter(pk=model.pk).update(
                parked_at=timezone.now() - timedelta(minutes=i), parked_error=error, failure_streak=failures
            )
        profile = model.profiles.first()
        for state in m["replicas"]:
            Replica.objects.create(model=model, profile=profile, profile_name=profile.name, state=state)
        if m["explained"] is not None:
            PlacementExplanation.objects.create(model=model, placed=m["explained"])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(catalog=MODELS)
def test_the_standing_is_the_model_lists_on_any_catalog(db, catalog):
    with transaction.atomic():
        _store(catalog)
        full = model_list()
        wanted = [{k: m[k] for k in (*STANDING, *STANDING_PARKED) if k in m} for m in full]
        assert model_standing() == wanted
        assert _model_totals(model_standing()) == _model_totals(full)
        transaction.set_rollback(True)
