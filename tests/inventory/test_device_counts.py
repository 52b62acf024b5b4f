"""The device counts in PostgreSQL (kept per node by a trigger) are inventory.devices' rules applied card by card.

Random fleets through the ORM, as any writer would store them: cards and MIG
instances (carved cards, instances whose card is missing, instances without
their MIG UUID), health in every shape JSON allows, MIG modes with the
whitespace Python strips and PostgreSQL's trim() does not, holders naming
junk (strings, booleans, floats, huge numbers, non-lists), several shards on
one node, and nodes in every state. After the fleet is stored, some cards
change and some go, so the trigger's updates and deletes are held too.

JSON ``true`` in a holder's list holds nothing (Python's
``isinstance(True, int)`` would have made it GPU 1): a boolean names no GPU.
"""

from __future__ import annotations

import sys
from collections import defaultdict

import pytest
from django.db import transaction
from django.utils import timezone
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inventory import devices
from inventory.devices import MIG_INDEX_BASE, mig_enabled, mig_index
from inventory.models import GPU, Node, NodeState
from inventory.reads.gpu_counts import DeviceCounts, device_counts
from placement import snapshot
from placement.models import Replica, Shard
from placement.reads import gpu_holders
from placement.scheduling import room
from tests.api.fleet import add_model

pytestmark = pytest.mark.django_db

WHITESPACE = "".join(c for c in map(chr, range(sys.maxunicode + 1)) if c.isspace())
CLASSES = ("h100-80g", "a100-80g", "a100-80g-mig-1g.10gb")
# As the agent writes a mode (agent/discovery/gpus.mig_mode_name) and as others might: a change waiting for a
# reset, other spellings, and any text at all.
SPELLED = ["", "Enabled", "enabled", "ENABLE", "on", "true", "Disabled", "off", "N/A", "en abled"]
PENDING = ["enabled (pending disable)", "disabled (pending enable)", "Enabled(pending disable)", "on-ish", "truely"]
# Any text a column holds (ingestion refuses a NUL or a lone surrogate before it is stored).
STORABLE = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x00"), max_size=8)
MODES = st.one_of(st.sampled_from(SPELLED + PENDING), STORABLE)
# Some of them wrapped in whitespace of every kind Python strips, and a few it does not (a zero-width space).
MIG_MODE = st.builds(
    lambda before, mode, after: before + mode + after,
    st.text(alphabet=WHITESPACE + "\u200b", max_size=2),
    MODES,
    st.text(alphabet=WHITESPACE + "\u200b", max_size=2),
)
# (A health or a holder that is JSON null cannot be stored: the ORM writes None as SQL NULL, and both are NOT NULL.)
HEALTH = st.sampled_from([[], ["Xid 79"], {}, {"xid": 79}, "", "fell off the bus", 0, 0.0, 1, False, True])
JUNK = st.one_of(
    st.integers(min_value=-2, max_value=70),
    st.sampled_from([1001, 1002, 1101, 2**31 - 1, 2**31, 10**10, 10**12, 10**30]),
    st.booleans(),
    st.floats(min_value=0, max_value=8, allow_nan=False),
    st.sampled_from(["0", "1", "7", "1001", "x", None, [1], {"0": 1}]),
)
HOLDS = st.one_of(
    st.lists(JUNK, max_size=5),
    st.sampled_from([3, True, "0,1", {"gpus": [0, 1]}, "junk", 1.0]),
)

CARD = st.fixed_dictionaries(
    {
        "index": st.one_of(st.integers(0, 9), st.integers(60, 66), st.just(999)),
        "gpu_class": st.sampled_from(CLASSES),
        "health": HEALTH,
        "mig_mode": MIG_MODE,
        # The MIG instances on this card: their instance numbers, with or without a MIG UUID.
        "instances": st.lists(st.tuples(st.integers(0, 6), st.booleans()), max_size=3, unique_by=lambda t: t[0]),
        "instance_health": HEALTH,
        "keep_card": st.booleans(),  # False: only the instances are stored (the card row is missing)
    }
)
NODE = st.fixed_dictionaries(
    {
        "state": st.sampled_from(NodeState.values),
        "reachable": st.booleans(),
        "cards": st.lists(CARD, max_size=5, unique_by=lambda c: c["index"]),
        "holders": st.lists(HOLDS, max_size=3),
    }
)
# After storing: (node, card position) pairs whose health or MIG mode changes, and cards deleted.
LATER = st.fixed_dictionaries(
    {
        "sicken": st.lists(st.tuples(st.integers(0, 9), st.integers(0, 4), HEALTH), max_size=4),
        "remode": st.lists(st.tuples(st.integers(0, 9), st.integers(0, 4), MIG_MODE), max_size=3),
        "delete": st.lists(st.tuples(st.integers(0, 9), st.integers(0, 4)), max_size=2),
    }
)


def _rows(node: Node, card: dict) -> list[GPU]:
    rows = []
    if card["keep_card"] or not card["instances"]:
        rows.append(
            GPU(node=node, index=card["index"], uuid=f"GPU-{card['index']}", name="card",
                gpu_class=card["gpu_class"], health=card["health"], mig_mode=card["mig_mode"])
        )  # fmt: skip
    if card["index"] < 10:  # an instance's number must stay under the next card's
        for gi, has_uuid in card["instances"]:
            rows.append(
                GPU(node=node, index=mig_index(card["index"], gi), uuid=f"GPU-{card['index']}", name="instance",
                    gpu_class=CLASSES[2], parent_index=card["index"], health=card["instance_health"],
                    mig_uuid=f"MIG-{card['index']}-{gi}" if has_uuid else "")
            )  # fmt: skip
    return rows


def _store(fleet: list[dict], later: dict) -> None:
    model = add_model()
    replica = Replica.objects.create(model=model, profile=model.profiles.first(), profile_name="h100", state="ready")
    nodes = Node.objects.bulk_create(
        Node(name=f"n{i}", state=n["state"], reachable=n["reachable"]) for i, n in enumerate(fleet)
    )
    rank = 0
    for node, n in zip(nodes, fleet, strict=True):
        # One INSERT per node, as ingestion stores a new node's cards.
        GPU.objects.bulk_create([row for card in n["cards"] for row in _rows(node, card)])
        for holds in n["holders"]:
            Shard.objects.create(replica=replica, node=node, rank=rank, gpu_indices=holds, state="ready")
            rank += 1
    cards = [list(GPU.objects.filter(node=node, parent_index__isnull=True).order_by("index")) for node in nodes]

    def card(i: int, j: int) -> GPU | None:
        on = cards[i % len(cards)] if cards else []
        return on[j % len(on)] if on else None

    for i, j, health in later["sicken"]:
        if g := card(i, j):
            GPU.objects.filter(pk=g.pk).update(health=health)
    for i, j, mode in later["remode"]:
        if g := card(i, j):
            g.mig_mode = mode
            g.save(update_fields=["mig_mode"])
    for i, j in later["delete"]:
        if g := card(i, j):
            GPU.objects.filter(pk=g.pk).delete()


COUNTED = ("total", "used", "free", "unhealthy", "held")


def card_by_card(free_nodes: bool = True) -> DeviceCounts:
    """The specification: every card read, counted by inventory.devices.count_by_class; free only on open nodes."""
    used: dict[int, set[int]] = defaultdict(set)
    for node_id, indices in gpu_holders():
        used[node_id].update(devices.held_indices(indices))
    gpus: dict[int, list[dict]] = defaultdict(list)
    fields = ("node_id", "index", "gpu_class", "health", "parent_index", "mig_mode", "mig_uuid")
    for g in GPU.objects.order_by().values(*fields):
        gpus[g["node_id"]].append(g)
    open_nodes = set(Node.objects.filter(state=NodeState.READY, reachable=True).values_list("pk", flat=True))
    classes: dict[str, dict] = {}
    free: set[int] = set()
    for node_id, rows in gpus.items():
        per_class = devices.count_by_class(rows, used.get(node_id, set()))
        total = sum(c["total"] for c in per_class)
        if free_nodes and total and sum(c["free"] for c in per_class) == total:
            free.add(node_id)
        for c in per_class:
            u = classes.setdefault(c["class"], {"class": c["class"], **dict.fromkeys(COUNTED, 0)})
            for key in ("total", "used", "unhealthy", "held"):
                u[key] += c[key]
            if node_id in open_nodes:
                u["free"] += c["free"]
    return DeviceCounts([classes[k] for k in sorted(classes)], frozenset(free))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(fleet=st.lists(NODE, min_size=1, max_size=6), later=LATER)
def test_the_database_counts_every_fleet_card_by_card(db, fleet, later):
    with transaction.atomic():
        _store(fleet, later)
        assert device_counts(gpu_holders()) == card_by_card()
        assert device_counts(gpu_holders(), free_nodes=False) == card_by_card(free_nodes=False)
        transaction.set_rollback(True)


def test_a_boolean_holds_no_gpu(db):
    """JSON true is not GPU 1, though Python's isinstance(True, int) says it is an int."""
    node = Node.objects.create(name="n0")
    GPU.objects.create(node=node, index=1, uuid="GPU-1", name="card", gpu_class="h100-80g")
    model = add_model()
    replica = Replica.objects.create(model=model, profile=model.profiles.first(), profile_name="h100", state="ready")
    Shard.objects.create(replica=replica, node=node, rank=0, gpu_indices=[True, "1", 1.0], state="ready")
    for counts in (device_counts(gpu_holders()), card_by_card()):
        assert counts.classes[0]["used"] == 0 and counts.classes[0]["free"] == 1, counts


def test_an_instance_named_twice_is_one_device_used(db):
    """The database path lists a node's held MIG instances with repeats and counts each once.

    One shard names instance 1 of card 0 twice, a second shard names it again: one device used, the
    other instance free, and the node is not entirely free. Random fleets seldom hold one instance
    twice, so this fails where the repeats are counted (``count(*)`` for ``count(DISTINCT m)``).
    """
    node = Node.objects.create(name="n0", state=NodeState.READY, reachable=True)
    GPU.objects.create(node=node, index=0, uuid="GPU-0", name="card", gpu_class=CLASSES[0], mig_mode="Enabled")
    for gi in (1, 2):
        GPU.objects.create(
            node=node, index=mig_index(0, gi), uuid="GPU-0", name="instance", gpu_class=CLASSES[2],
            parent_index=0, mig_uuid=f"MIG-0-{gi}",
        )  # fmt: skip
    model = add_model()
    replica = Replica.objects.create(model=model, profile=model.profiles.first(), profile_name="h100", state="ready")
    held = mig_index(0, 1)
    Shard.objects.create(replica=replica, node=node, rank=0, gpu_indices=[held, held], state="ready")
    Shard.objects.create(replica=replica, node=node, rank=1, gpu_indices=[held], state="ready")
    for counts in (device_counts(gpu_holders()), card_by_card()):
        assert [(c["class"], c["total"], c["used"], c["free"]) for c in counts.classes] == [(CLASSES[2], 2, 1, 1)]
        assert counts.free_nodes == frozenset(), counts


def test_the_nodes_entirely_free_are_named_only_when_asked_for(db):
    node = Node.objects.create(name="n0")
    GPU.objects.create(node=node, index=0, uuid="GPU-0", name="card", gpu_class=CLASSES[0])
    assert device_counts(gpu_holders()).free_nodes == {node.pk}
    assert device_counts(gpu_holders(), free_nodes=False).free_nodes == frozenset()


def test_the_migrations_whitespace_is_what_python_strips():
    """The trigger trims a MIG mode of the characters Python's str.strip() takes, listed in the migration."""
    import importlib

    migration = importlib.import_module("inventory.migrations.0012_node_devices")
    listed = migration.PYTHON_WHITESPACE.removeprefix("U&'").removesuffix("'")
    assert "".join(chr(int(code, 16)) for code in listed.split("\\")[1:]) == WHITESPACE
    assert MIG_INDEX_BASE == 1000, "the trigger numbers MIG instances from 1000"


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(fleet=st.lists(NODE, min_size=1, max_size=6), later=LATER)
def test_the_scheduler_holds_back_the_cards_the_counts_hold_back(db, fleet, later):
    """The drift this holds: a card whose mode read ``enabled (pending disable)`` was free in the summary and
    /metrics and held back by the scheduler. Both read inventory.devices.mig_enabled now; so does the SQL."""
    with transaction.atomic():
        _store(fleet, later)
        snap = snapshot.load(timezone.now()).snapshot
        scheduler: dict[str, int] = defaultdict(int)
        for node in snap.nodes:
            stock, _ = room._stock(node.gpus)
            for cls, st_ in stock.items():
                scheduler[cls] += st_.held.get("in MIG mode with no instances", 0) + st_.held.get(
                    "without a MIG UUID", 0
                )
        counted = {c["class"]: c["held"] for c in device_counts(gpu_holders()).classes}
        assert {k: v for k, v in counted.items() if v} == {k: v for k, v in scheduler.items() if v}
        transaction.set_rollback(True)


def test_a_mode_is_in_mig_mode_by_its_current_word_as_the_agent_writes_it():
    assert [
        mig_enabled(m) for m in ("enabled", "disabled", "enabled (pending disable)", "disabled (pending enable)")
    ] == [
        True,
        False,
        True,
        False,
    ]
    assert mig_enabled("Enabled") and mig_enabled(" ON ") and not mig_enabled("N/A") and not mig_enabled(None)


@given(word=st.sampled_from(SPELLED), pending=st.sampled_from(["", " (pending enable)", "(pending disable)", "\t(x)"]))
def test_what_is_pending_never_changes_the_current_mode(word, pending):
    assert mig_enabled(word + pending) == mig_enabled(word) == mig_enabled(word.swapcase())
