"""A shard's start phases, as its agent's heartbeats report them, through the real endpoint: kept on the shard
while it starts, written once as a ColdStart when it is ready, shown in the replica list and used for the
next estimate; an absurd timing is refused with a sentence and changes nothing."""

from __future__ import annotations

import pytest

from placement import reads, starts
from placement.models import ColdStart, Shard
from placement.writes.reconciler import reconcile
from tests.agentapi import agenthttp
from tests.placement.dbfleet import credential, fleet, gpu_profile, heartbeat, live, model, shard_entry

pytestmark = pytest.mark.django_db

OWN = "http://127.0.0.1:8000"


@pytest.fixture
def one():
    fleet("h100-hgx:2@north")
    model("m", gpu_profile("h100-80g", gpus=8, name="h100"))
    reconcile()
    (r,) = live("m")
    return r, Shard.objects.select_related("node").get(replica=r).node.name


def test_phases_are_kept_while_starting_and_recorded_once_when_ready(one):
    r, node = one
    heartbeat(node, [shard_entry(r, "fetching", phases={"fetch_s": 4.0})])
    assert Shard.objects.get(replica=r).phases == {"fetch_s": 4.0}
    status = starts.cold_start(r.model_id)
    assert status["state"] == "fetching" and status["node"] == node and not status["measured"]
    assert status["sentence"].startswith(f"m: replica starting on {node}, fetching the weights")
    heartbeat(node, [shard_entry(r, "starting", phases={"fetch_s": 12.5, "load_s": 1.0, "weights_local": False})])
    ready = {"fetch_s": 12.5, "load_s": 30.0, "weights_local": False}
    for _ in range(2):  # the agent says ready with every beat: one measurement all the same
        heartbeat(node, [shard_entry(r, "ready", endpoint=OWN, phases=ready)])
    (row,) = ColdStart.objects.all()
    assert (row.node, row.profile_name, row.fetch_s, row.load_s, row.weights_local) == (node, "h100", 12.5, 30, False)
    (view,) = reads.replica_list("m")
    assert view["shards"][0]["phases"] == ready and "start" not in view, "a ready replica has no start to tell"
    # The next start of m on h100 is estimated from it, on this node and on another.
    assert starts.start_samples(r.model_id, "h100")[0].load_s == 30


def test_the_estimate_drops_the_fetch_where_the_node_holds_the_weights(one):
    r, node = one
    ColdStart.objects.create(
        model_id=r.model_id,
        profile_name="h100",
        node=node,
        replica_id="old",
        fetch_s=50,
        load_s=20,
        weights_local=False,
    )
    heartbeat(node, [shard_entry(r, "starting", phases={"fetch_s": 0.2, "load_s": 5.0, "weights_local": True})])
    status = starts.cold_start(r.model_id)
    assert status["measured"] and status["estimate_fetch_s"] == 0 and status["estimate_load_s"] == 20
    assert status["remaining_s"] == 15 and "holds the weights" in status["basis"]
    (view,) = reads.replica_list("m")
    assert view["start"]["sentence"] == f"m: replica starting on {node}, loading the engine, about 15 s left"


@pytest.mark.parametrize(
    ("phases", "sentence"),
    [
        ({"fetch_s": -1}, "heartbeat.shards[0].phases.fetch_s must be a number of seconds between 0 and 604800"),
        ({"load_s": 10**30}, "heartbeat.shards[0].phases.load_s must be a number of seconds between 0 and 604800"),
        ({"load_s": "soon"}, "heartbeat.shards[0].phases.load_s must be a number of seconds"),
        ({"load_s": True}, "heartbeat.shards[0].phases.load_s must be a number of seconds"),
        ({"weights_local": "yes"}, "heartbeat.shards[0].phases.weights_local must be true or false"),
        ([1, 2], "heartbeat.shards[0].phases must be an object of fetch_s, load_s (seconds) and weights_local"),
    ],
)
def test_an_absurd_timing_is_refused_with_a_sentence_and_changes_nothing(one, phases, sentence):
    r, node = one
    answer = agenthttp.heartbeat(credential(node), {"shards": [shard_entry(r, "ready", endpoint=OWN, phases=phases)]})
    assert answer.status_code == 400
    assert sentence in answer.content.decode()
    shard = Shard.objects.get(replica=r)
    assert shard.state == "pending" and shard.phases == {} and not ColdStart.objects.exists()
