"""A value no column can hold is a 400 that names it, on every agent endpoint, and nothing stored changes.

Before, each of these reached the database and failed there: a 500, which the
agent takes for "unreachable", so it resent the whole report forever and never
sent a heartbeat again.
"""

from __future__ import annotations

import copy
import json

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from core import storable
from inventory.models import Node
from inventory.writes.heartbeats import desk
from tests.agentapi.agenthttp import HEARTBEAT, asgi, heartbeat, post, register, snapshot
from tests.agentapi.reports import gpu, report

pytestmark = pytest.mark.django_db(transaction=True)

PORT = report()["ib_ports"][0]


def with_port(**changes) -> dict:
    return report(ib_ports=[{**PORT, **changes}])


def with_gpu(**changes) -> dict:
    return report(gpus=[{**gpu(0), **changes}])


def with_fabric(**changes) -> dict:
    card = gpu(0)
    card["fabric"].update(changes)
    return report(gpus=[card])


CASES = [
    (report(hostname="tray\x00-01"), "report.hostname: 'tray\\x00-01' holds a NUL character"),
    (report(agent_version="v" * 60), "report.agent_version: 'vvvv"),
    (report(agent_version="v" * 60), "... is 60 characters; the column holds 50"),
    (with_port(port=70000), "ib_ports[0].port: 70000 is more than the column holds (32767)"),
    (with_gpu(numa=2**31), "gpus[0].numa: 2147483648 is more than the column holds (2147483647)"),
    (with_gpu(numa=-(2**31) - 1), "gpus[0].numa: -2147483649 is less than the column holds (-2147483648)"),
    (with_gpu(memory_mb=2**63), "gpus[0].memory_mb: 9223372036854775808 is more than the column holds"),
    (with_gpu(index=2**31), "gpus[0].index: 2147483648 is more than the column holds"),
    (with_gpu(uuid="G" * 101), "gpus[0].uuid: "),
    (with_fabric(cluster_uuid="c" * 65), "gpus[0].fabric.cluster_uuid: "),
    (with_fabric(clique_id=2**63), "gpus[0].fabric.clique_id: "),
    (with_port(hca="m" * 65), "ib_ports[0].hca: "),
    (with_port(sm_lid=2**31), "ib_ports[0].sm_lid: "),
    (report(host={"os": "u" * 101}), "report.host.os: "),
    (report(imex={"state": "s" * 33}), "report.imex.state: "),
    (report(fabrics={"f" * 101: ["mlx5_0"]}), "report.fabrics: a name "),
    (report(engines={"vllm": "0.11\x00"}), "report.engines.vllm: '0.11\\x00' holds a NUL character"),
    (report(problems=["\ud800"]), "report.problems[0]: '\\ud800' holds a lone surrogate"),
    (with_port(counters={"symbol_error": float("inf")}), "report.ib_ports[0].counters.symbol_error: inf is not"),
    (report(load={"cpu_percent": float("nan")}), "report.load.cpu_percent: nan is not a number"),
    (report(disks=[{"mount\x00": "/"}]), "report.disks[0]: a key 'mount\\x00' holds a NUL"),
]


def raw(body) -> bytes:
    # json.dumps writes NaN and Infinity, which Python's reader accepts back: what a buggy agent would send.
    return json.dumps(body).encode()


@pytest.mark.parametrize(("body", "words"), CASES, ids=[w.split(":")[0] for _, w in CASES])
def test_an_unstorable_report_is_a_400_with_the_path_and_nothing_changes(client, node, body, words):
    before = snapshot()
    answer = post(client, "report", None, node, raw=raw(body))
    assert answer.status_code == 400, answer.content
    assert words in answer.json()["error"]
    assert snapshot() == before


AT_REGISTRATION = CASES[:3] + CASES[-4:]


@pytest.mark.parametrize(("body", "words"), AT_REGISTRATION, ids=[w.split(":")[0] for _, w in AT_REGISTRATION])
def test_an_unstorable_report_at_registration_is_a_400_and_registers_nothing(client, join, body, words):
    answer = post(client, "register", None, join, raw=raw({"name": "tray-09", "machine_id": "m-9", "report": body}))
    assert answer.status_code == 400 and words in answer.json()["error"]
    assert not Node.objects.filter(name="tray-09").exists()


def test_a_nul_in_the_registration_itself_is_a_400(client, join):
    answer = post(client, "register", {"name": "tray-09", "machine_id": "m\x00"}, join)
    assert answer.status_code == 400 and "registration.machine_id" in answer.json()["error"]


HEARTBEATS = [
    ({"load": {"cpu_percent": float("nan")}}, "heartbeat.load.cpu_percent: nan is not a number"),
    ({"shards": [{"id": "r-0", "error": "boom\x00"}]}, "heartbeat.shards[0].error: 'boom\\x00' holds a NUL"),
    ({"collected": [{"path": "/models/\x00"}]}, "heartbeat.collected[0].path"),
    ({"load": {"\ud800": 1}}, "heartbeat.load: a key '\\ud800' holds a lone surrogate"),
]


@pytest.mark.parametrize(("beat", "words"), HEARTBEATS, ids=[w.split(":")[0] for _, w in HEARTBEATS])
def test_an_unstorable_heartbeat_is_a_400_and_the_flush_still_writes_the_others(client, join, node, beat, words):
    other = register(client, join, name="tray-02", machine_id="m-2").json()["credential"]
    desk.pending.clear()
    refused = asgi(HEARTBEAT, node, raw=raw(beat))
    assert refused.status_code == 400 and refused.json()["error"].startswith("the heartbeat was not stored: ")
    assert words in refused.json()["error"]
    good = asgi(HEARTBEAT, other, raw=b'{"load": {"cpu_percent": 7.0}}')
    assert good.status_code == 200
    assert desk.flush().written == 1, "one node's bad beat never reached the batch the others are written in"
    assert Node.objects.get(name="tray-02").load == {"cpu_percent": 7.0}


@pytest.mark.parametrize("path", ["register", "report", "heartbeat", "scan"])
def test_deeply_nested_json_is_a_400_with_a_sentence_on_every_agent_endpoint(client, join, node, path, caplog):
    before = snapshot()
    deep = b"[" * 100_000 + b"]" * 100_000
    if path == "heartbeat":
        answer = heartbeat(node, raw=deep)
    else:
        answer = post(client, path, None, join if path == "register" else node, raw=deep)
    assert answer.status_code == 400 and "nested deeper than 64 levels" in answer.json()["error"]
    assert snapshot() == before
    assert "Traceback" not in caplog.text and "RecursionError" not in caplog.text


def test_deeply_nested_json_is_a_400_on_the_fast_lane(node):
    deep = b'{"load": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    answer = asgi(HEARTBEAT, node, raw=deep)
    assert answer.status_code == 400 and "nested deeper than 64 levels" in answer.json()["error"]


def test_values_at_the_column_limits_are_stored(client, node):
    edge = copy.deepcopy(report(agent_version="v" * 50, hostname="h" * 255))
    edge["gpus"][0].update(uuid="G" * 100, numa=2**31 - 1, memory_mb=2**63 - 1)
    edge["ib_ports"][0].update(port=32767, hca="m" * 64)
    answer = post(client, "report", edge, node)
    assert answer.status_code == 200, answer.content
    stored = Node.objects.get()
    assert stored.agent_version == "v" * 50 and stored.gpus.get(index=0).memory_mb == 2**63 - 1


def test_a_refused_report_is_kept_on_the_node_until_one_is_taken_and_heartbeats_go_on(client, node):
    from placement.reads import node_detail, node_list

    refused = post(client, "report", with_port(port=70000), node)
    assert refused.status_code == 400
    stored = Node.objects.get()
    assert stored.report_error == refused.json()["error"]
    assert node_detail("tray-01")["report_error"] == stored.report_error
    (listed,) = node_list()
    assert any("last full report was refused" in w and "ib_ports[0].port" in w for w in listed["warnings"])
    assert heartbeat(node, {}).status_code == 200
    assert post(client, "report", report(), node).status_code == 200
    assert Node.objects.get().report_error == "" and "report_error" not in node_detail("tray-01")


# A key no column can hold (a lone surrogate, a NUL), put at any depth of any part of a report, with anything
# beneath it, bad values and bad keys included: the refusal's words quote the path down to each problem.
BAD_TEXT = st.sampled_from(["\ud800", "x\udfff", "\udc80y", "a\x00"])
TEXT = st.one_of(st.text(max_size=4), BAD_TEXT)
BENEATH = st.recursive(
    st.one_of(st.none(), st.integers(), TEXT),
    lambda children: st.one_of(st.lists(children, max_size=3), st.dictionaries(TEXT, children, max_size=3)),
    max_leaves=8,
)
AT = st.sampled_from(["load", "engines", "host", "disks", "fabrics", "problems", "gpus", "not_a_field"])
WRAPPERS = st.lists(st.one_of(st.text(max_size=3), st.just(None)), max_size=3)


def with_bad_key(at: str, key: str, beneath, wrappers: list) -> dict:
    value = {key: beneath}
    for wrapper in wrappers:
        value = [value] if wrapper is None else {wrapper: value}
    return report(**{at: value})


def refused_with_words(answer) -> str:
    assert answer.status_code == 400, answer.content
    words = answer.json()["error"]
    assert storable.text_problem(words) is None
    assert "lone surrogate" in words or "NUL" in words
    return words


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(at=AT, key=BAD_TEXT, beneath=BENEATH, wrappers=WRAPPERS)
@example(at="load", key="\ud800", beneath={"x": "\x00"}, wrappers=[])
@example(at="engines", key="\ud800", beneath={"\udfff": ["\ud800"]}, wrappers=["a", None])
def test_a_bad_key_at_any_depth_of_a_report_is_a_400_on_every_lane(client, join, node, at, key, beneath, wrappers):
    body = raw(with_bad_key(at, key, beneath, wrappers))
    before = snapshot()
    words = refused_with_words(post(client, "report", None, node, raw=body))
    kept = Node.objects.get(name="tray-01").report_error  # kept, as long as its column takes
    assert kept and words.startswith(kept)
    refused_with_words(asgi("/api/v1/agent/report", node, raw=body))
    registration = raw({"name": "tray-09", "machine_id": "m-9", "report": with_bad_key(at, key, beneath, wrappers)})
    refused_with_words(post(client, "register", None, join, raw=registration))
    refused_with_words(asgi(HEARTBEAT, node, raw=raw({"load": with_bad_key(at, key, beneath, wrappers)[at]})))
    scan = raw({"fabric": "ib-0", "output": "x", "extra": with_bad_key(at, key, beneath, wrappers)[at]})
    refused_with_words(post(client, "scan", None, node, raw=scan))
    assert snapshot() == before
