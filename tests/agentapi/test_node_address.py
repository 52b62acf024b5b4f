"""A node's engine address is one it connects from, or in the operator's networks; never the control host's own.

The gateway sends clients' prompts and the replica's key to the address a
rank-0 node claims. These post registrations and reports through the ASGI
application ``llmgw serve`` runs (its report fast lane, then the view), from
a chosen peer address, with and without a proxy's ``X-Forwarded-For``.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inventory import node_address
from inventory.models import Node
from llmgw.asgi import application
from llmgw.bootstrap import issue_join_token
from tests.agentapi.reports import report

pytestmark = pytest.mark.django_db(transaction=True)

NODE_IP = "10.9.8.7"
# Every spelling the resolver reads as the control host itself, or the cloud's metadata service.
HOSTILE = ["127.0.0.1", "localhost", "LOCALHOST.", "127.1", "2130706433", "0x7f000001", "0.0.0.0", "[::1]", "::1"]
HOSTILE += ["::ffff:127.0.0.1", "169.254.169.254", "fe80::1", "224.0.0.1", "::"]


def send(path: str, token: str, body: dict, *, peer: str, forwarded: str | None = None) -> httpx.Response:
    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=application, client=(peer, 40000))
        async with httpx.AsyncClient(transport=transport, base_url="http://control") as http:
            headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
            if forwarded is not None:
                headers["X-Forwarded-For"] = forwarded
            return await http.post(path, content=json.dumps(body).encode(), headers=headers)

    return asyncio.run(go())


def register(address: str | None, *, peer: str, forwarded: str | None = None, name: str = "tray-9") -> httpx.Response:
    extra = {} if address is None else {"address": address}
    body = {"name": name, "machine_id": name, "report": report(hostname=name, **extra)}
    return send("/api/v1/agent/register", issue_join_token(), body, peer=peer, forwarded=forwarded)


@pytest.mark.parametrize("address", HOSTILE)
def test_a_remote_node_cannot_claim_the_control_hosts_own_addresses(address):
    answer = register(address, peer=NODE_IP)
    assert answer.status_code == 400, answer.text
    # Each says why: the address is the control host's (or does not resolve here at all: "localhost.").
    assert answer.json()["error"].startswith(f"the report was not stored: address {address.lower()!r}")
    assert not Node.objects.exists()


def test_a_hostname_standing_for_loopback_is_refused_when_no_address_is_given():
    answer = register(None, peer=NODE_IP, name="localhost")
    assert answer.status_code == 400 and "loopback" in answer.json()["error"], answer.text


def test_an_address_elsewhere_is_refused_unless_in_the_operators_networks(monkeypatch):
    answer = register("10.50.0.9", peer=NODE_IP)
    assert answer.status_code == 400 and "LLMGW_NODE_NETWORKS" in answer.json()["error"], answer.text
    monkeypatch.setenv("LLMGW_NODE_NETWORKS", "10.50.0.0/16")
    answer = register("10.50.0.9", peer=NODE_IP)
    assert answer.status_code == 201, answer.text
    assert Node.objects.get().mgmt_addr == "10.50.0.9"


def test_the_networks_never_open_loopback(monkeypatch):
    monkeypatch.setenv("LLMGW_NODE_NETWORKS", "0.0.0.0/0,::/0")
    assert register("127.0.0.1", peer=NODE_IP).status_code == 400


def test_a_node_claims_the_address_it_connects_from_and_a_local_node_anything():
    assert register(NODE_IP, peer=NODE_IP).status_code == 201
    # llmgw simulate and the README's one-machine agent: on the control host, advertising loopback.
    assert register("127.0.0.1", peer="127.0.0.1", name="local").status_code == 201
    assert Node.objects.get(name="local").mgmt_addr == "127.0.0.1"


def test_a_later_report_cannot_move_the_address_and_is_kept_as_refused():
    answer = register(NODE_IP, peer=NODE_IP)
    assert answer.status_code == 201
    token = answer.json()["credential"]
    moved = send("/api/v1/agent/report", token, report(hostname="tray-9", address="localhost"), peer=NODE_IP)
    assert moved.status_code == 400 and "loopback" in moved.json()["error"], moved.text
    node = Node.objects.get()
    assert node.mgmt_addr == NODE_IP and "localhost" in node.report_error
    same = send("/api/v1/agent/report", token, report(hostname="tray-9", address=NODE_IP, engines={}), peer=NODE_IP)
    assert same.status_code == 200, same.text


def test_behind_a_proxy_the_forwarded_address_counts(monkeypatch):
    # HAProxy on the control host (the default trusted proxy, loopback) appends the agent's address.
    assert register("127.0.0.1", peer="127.0.0.1", forwarded=NODE_IP).status_code == 400
    assert register(NODE_IP, peer="127.0.0.1", forwarded=f"127.0.0.1, {NODE_IP}").status_code == 201
    # A client's own X-Forwarded-For is not believed: only a trusted proxy's is.
    assert register("127.0.0.1", peer=NODE_IP, forwarded="127.0.0.1", name="forger").status_code == 400
    # A proxy on another host is believed once the operator names it.
    assert register(NODE_IP, peer="10.0.0.11", forwarded=NODE_IP, name="behind").status_code == 400
    monkeypatch.setenv("LLMGW_TRUSTED_PROXIES", "10.0.0.11")
    assert register(NODE_IP, peer="10.0.0.11", forwarded=NODE_IP, name="behind").status_code == 201


_ips = st.one_of(st.ip_addresses(v=4), st.ip_addresses(v=6))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(claimed=_ips, peer=_ips, networks=st.lists(st.ip_addresses(v=4).map(lambda a: f"{a}/8"), max_size=3))
def test_the_rule_over_any_addresses(claimed, peer, networks):
    """Loopback, link-local and unspecified claims pass only from loopback; others only as the peer or listed."""
    rules = node_address.AddressRules(networks=node_address.parse_networks("X", ",".join(networks)))
    problem = node_address.address_problem(str(claimed), node_address.ip_of(str(peer)), rules)
    claimed_ip, peer_ip = node_address.ip_of(str(claimed)), node_address.ip_of(str(peer))
    if peer_ip.is_loopback:
        assert problem is None
    elif claimed_ip.is_loopback or claimed_ip.is_link_local or claimed_ip.is_unspecified:
        assert problem is not None
    elif claimed_ip == peer_ip and not (claimed_ip.is_multicast or claimed_ip.is_reserved):
        assert problem is None
    elif not any(claimed_ip in ipaddress.ip_network(n, strict=False) for n in networks):
        assert problem is not None


@pytest.mark.parametrize("variable", ["LLMGW_NODE_NETWORKS", "LLMGW_TRUSTED_PROXIES"])
def test_a_bad_network_stops_start_up_naming_the_variable(monkeypatch, variable):
    from inventory.checks import loss_settings

    monkeypatch.setenv(variable, "10.0.0.0/8, tray-7")
    (error,) = loss_settings()
    assert error.id == "inventory.E001" and error.msg.startswith(f"{variable}: 'tray-7' is not a network")
