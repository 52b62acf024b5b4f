"""Which address a node may claim for its engines: one it connects from, or one in the operator's networks.

A rank-0 node's report names the address its engines answer on (the agent's
``--advertise-host``, else its hostname); the gateway then sends clients'
prompts and the replica's key there (placement/writes/shard_status.node_hosts
takes an endpoint only at that address). A node that could claim any address
could point that traffic at the control host's own loopback, at the cloud's
metadata service, or at another machine. So a claimed address is kept only
when every address it stands for is

- the address the node connects from (its peer, seen through the proxies the
  operator trusts: ``LLMGW_TRUSTED_PROXIES``), or
- inside one of the operator's ``LLMGW_NODE_NETWORKS`` (for nodes whose
  engines answer on another network than the one their agent talks on),

and never a loopback, link-local, unspecified, multicast or reserved address,
whatever the networks say, unless the node itself connects from loopback: a
node on the control host (``llmgw simulate``, the README's one-machine flow)
reaches the control host's loopback anyway.

A hostname (anything that is not an IP literal, ``127.1`` and ``2130706433``
included, which the resolver reads as 127.0.0.1) is resolved here as the
gateway would resolve it, and every address it resolves to must pass.

Free of Django: the agent API's views call :func:`address_problem` with the
request's peer; the settings are read by :func:`address_rules`.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from core.config import ConfigError

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

# A proxy on the control host itself is believed by default: a node connecting from loopback could claim
# any address anyway, so believing its X-Forwarded-For gives nothing away.
TRUSTED_PROXIES_DEFAULT = "127.0.0.0/8,::1/128"


@dataclass(frozen=True)
class AddressRules:
    """The operator's networks for node addresses, and the proxies whose ``X-Forwarded-For`` is believed."""

    networks: tuple[IPNetwork, ...] = ()
    trusted_proxies: tuple[IPNetwork, ...] = ()


def parse_networks(variable: str, text: str) -> tuple[IPNetwork, ...]:
    """``10.0.0.0/16, 10.1.2.3`` → the networks; :class:`ConfigError` naming ``variable`` for any other entry."""
    out = []
    for entry in (e.strip() for e in text.split(",")):
        if not entry:
            continue
        try:
            out.append(ipaddress.ip_network(entry, strict=False))
        except ValueError:
            why = f"{entry!r} is not a network (a CIDR such as 10.0.0.0/16, or one address)"
            raise ConfigError(variable, why) from None
    return tuple(out)


def address_rules(env: Mapping[str, str] | None = None) -> AddressRules:
    """The rules as ``LLMGW_NODE_NETWORKS`` and ``LLMGW_TRUSTED_PROXIES`` set them (docs/operations.md)."""
    env = os.environ if env is None else env
    return AddressRules(
        networks=parse_networks("LLMGW_NODE_NETWORKS", env.get("LLMGW_NODE_NETWORKS", "")),
        trusted_proxies=parse_networks(
            "LLMGW_TRUSTED_PROXIES", env.get("LLMGW_TRUSTED_PROXIES", TRUSTED_PROXIES_DEFAULT)
        ),
    )


def ip_of(text: str) -> IPAddress | None:
    """An IP literal (``[::1]`` too), an IPv4-mapped IPv6 address read as its IPv4; None for anything else."""
    try:
        ip = ipaddress.ip_address(text.strip().removeprefix("[").removesuffix("]"))
    except ValueError:
        return None
    mapped = getattr(ip, "ipv4_mapped", None)
    return mapped or ip


def _within(ip: IPAddress, networks: Iterable[IPNetwork]) -> bool:
    return any(ip.version == net.version and ip in net for net in networks)


def peer_of(remote_addr: str | None, forwarded_for: str, trusted: Iterable[IPNetwork]) -> IPAddress | None:
    """The address a request comes from: its socket's peer, or, while that is a trusted proxy, the entry
    the proxy appended to ``X-Forwarded-For`` (read from the right, so a client cannot choose it by
    sending the header itself). None when unknown (no peer, or a malformed entry past a trusted proxy)."""
    trusted = tuple(trusted)
    peer = ip_of(remote_addr or "")
    hops = [h.strip() for h in forwarded_for.split(",") if h.strip()]
    while peer is not None and hops and _within(peer, trusted):
        peer = ip_of(hops.pop())
    return peer


def _special(ip: IPAddress) -> str | None:
    """What makes ``ip`` no place for a node's engines (seen from the control host), or None."""
    if ip.is_loopback:
        return "is the control host's own loopback"
    if ip.is_unspecified:
        return "is the unspecified address, which reaches the control host itself"
    if ip.is_link_local:
        return "is link-local (the cloud's metadata service lives there)"
    if ip.is_multicast or ip.is_reserved:
        return "is not a unicast address"
    return None


Resolver = Callable[[str], list[str]]


def resolve(host: str) -> list[str]:
    """The addresses the system's resolver gives ``host`` (as the gateway's client would connect); [] when none."""
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError):
        return []
    return sorted({str(info[4][0]) for info in infos})


def address_problem(
    claimed: str, peer: IPAddress | None, rules: AddressRules, resolver: Resolver = resolve
) -> str | None:
    """Why a node connecting from ``peer`` may not claim ``claimed`` for its engines; None when it may."""
    if peer is not None and peer.is_loopback:
        return None  # a node on the control host: see the module's docstring
    where = f"the node connects from {peer}" if peer is not None else "the node's own address is unknown"
    literal = ip_of(claimed)
    addresses = [literal] if literal is not None else [ip_of(a) for a in resolver(claimed)]
    if not addresses:
        return f"address {claimed[:255]!r} does not resolve on the control host, so no engine there could be reached"
    for ip in addresses:
        if ip is None:
            return f"address {claimed[:255]!r} resolves to something that is not an IP address"
        named = f"{claimed[:255]!r}" if literal is not None else f"{claimed[:255]!r} ({ip})"
        special = _special(ip)
        if special:
            return f"address {named} {special}; {where}, not from it"
        if ip != peer and not _within(ip, rules.networks):
            return (
                f"address {named} is not where the node connects from ({where}) nor in LLMGW_NODE_NETWORKS: "
                "advertise the address the agent connects from, or have the operator list its network there"
            )
    return None
