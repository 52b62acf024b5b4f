"""The summary's fabrics counted in PostgreSQL are the specification's, for any nodes and weights.

``fleet_sql.fabrics`` counts in one query what ``summary_spec.fabrics``
counts over the node listing's views: nodes per declared fabric, those with
weights on disk and how many distinct weights, and the nodes whose every
device is free on an open node (the largest free block). Here random nodes
(fabrics of any names, shared or not, weights named, path-only, nameless or
not objects at all, any state) and any per-node device counts go through
both. Weight names are strings or absent, as a report's are
(where the two part: ``str(name or path)`` there, the first present here).
"""

from __future__ import annotations

from django.db import transaction
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inventory.models import Node
from inventory.reads.nodes import _weight_names
from observability import fleet_sql
from tests.observability.summary_spec import fabrics

NAMES = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",), exclude_characters="\x00"), max_size=6)
WEIGHT = st.one_of(
    st.fixed_dictionaries({"name": NAMES.filter(bool)}, optional={"path": NAMES}),
    st.fixed_dictionaries({"path": NAMES.filter(bool)}),
    st.just({}),
    st.just("junk"),
    st.integers(),
)
NODE = st.fixed_dictionaries(
    {
        "fabrics": st.one_of(st.none(), st.dictionaries(NAMES, st.lists(st.just("mlx5_0"), max_size=1), max_size=3)),
        "weights": st.one_of(st.none(), st.lists(WEIGHT, max_size=4)),
        "state": st.sampled_from(["ready", "cordoned", "draining"]),
        "reachable": st.booleans(),
        "devices": st.tuples(st.integers(0, 8), st.integers(0, 8)).map(lambda t: (t[0], min(t))),
    }
)


def view(node: Node, devices: tuple[int, int]) -> dict:
    """What ``fabrics`` reads of a node's listing view."""
    out = {"reachable": node.reachable, "state": node.state, "gpu_total": devices[0], "gpu_free": devices[1]}
    if node.fabrics is not None:
        out["fabrics"] = sorted(node.fabrics)
    if (names := _weight_names(node.weights)) is not None:
        out["models_on_disk"] = names
    return out


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(fleet=st.lists(NODE, max_size=8))
def test_the_database_counts_the_fabrics_as_row_by_row(db, fleet):
    with transaction.atomic():
        nodes = [
            Node.objects.create(
                name=f"n{i}", fabrics=n["fabrics"], weights=n["weights"], state=n["state"], reachable=n["reachable"]
            )
            for i, n in enumerate(fleet)
        ]
        per_node = {node.pk: n["devices"] for node, n in zip(nodes, fleet, strict=True)}
        views = [view(node, per_node[node.pk]) for node in nodes]
        free = {pk for pk, (total, idle) in per_node.items() if total and idle == total}
        assert fleet_sql.fabrics(free) == fabrics(views)
        transaction.set_rollback(True)
