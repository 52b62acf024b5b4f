"""The NVLink fabric rules: whether a card has a multi-node fabric, which domain it names, whether it joined.

One home for what ingestion, the NVLink report, the scheduler's room, the
doctor sweeps and ``/metrics`` each used to decide for themselves. Pure: no
Django, no I/O; every function takes the raw field values as a card reported
them (the report's ``fabric`` object, or the GPU row's columns).

The values, as nvidia-smi and NVML print them (the captures in the fixtures):

- state: ``Not Supported``, ``Not Started``, ``In Progress``, ``Completed``;
  ``N/A`` from a card or driver without fabric (an A100 in MIG mode, a
  GeForce), empty when nothing was reported;
- status: ``Success`` once registration succeeded, else NVML's error in words
  (``Insufficient Resources``), ``N/A`` before Completed;
- ClusterUUID: the domain's UUID; all zeros on a single machine's own
  NVSwitch (an HGX box, ``Completed``/``Success``, CliqueId 0) and on a card
  whose registration failed; ``N/A`` on a card without fabric;
- CliqueId: a number, 0 with the all-zero UUID; absent on older drivers.

Spellings that differ only in case, surrounding or repeated whitespace, or
``_`` for a space (``not_supported``), or brackets (``[N/A]``) mean the same, and every answer here
is the same for them. A UUID is compared lower-cased, as the domain table
stores it.
"""

from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple

# States of a card with no multi-node fabric at all: a PCIe card, a card in MIG mode, nothing reported.
NO_FABRIC_STATES = frozenset({"", "n/a", "not supported"})
COMPLETED = "completed"
SUCCESS = "success"
# What nvidia-smi prints in place of a UUID it does not have.
MISSING_UUIDS = frozenset({"", "n/a", "none", "not supported"})
# (fabric state, status, ClusterUUID) exactly as nvidia-smi prints them for a card whose fabric is
# complete but names no domain: an HGX box's cards, alone in their chassis. Such a card, in no
# domain, claims none and is not trying to join one (the test holds this against the rules below),
# so a reader may leave a node whose cards are all like it out before reading any card.
SETTLED_ALONE = ("Completed", "Success", "00000000-0000-0000-0000-000000000000")


class DomainKey(NamedTuple):
    """An NVLink domain's identity: its ClusterUUID (lower case) and CliqueId."""

    cluster_uuid: str
    clique_id: int

    @property
    def text(self) -> str:
        """``<ClusterUUID>/<CliqueId>``, as ``NVLinkDomain.key`` names a domain."""
        return f"{self.cluster_uuid}/{self.clique_id}"


# Remembered: a fleet reports a handful of distinct words (states, statuses, one UUID a rack) for
# tens of thousands of cards, and the NVLink report reads each card's three times.
@lru_cache(maxsize=4096)
def words(raw: str | None) -> str:
    """A reported word as the rules compare it: lower case, ``_`` as a space, whitespace collapsed, no brackets.

    nvidia-smi brackets a value it could not read in some versions (``[N/A]``).
    """
    return " ".join((raw or "").replace("_", " ").split()).strip("[] ").lower()


def has_fabric(state: str | None) -> bool:
    """Whether the card has a multi-node-capable fabric to register with (anything but none / N/A / empty)."""
    return words(state) not in NO_FABRIC_STATES


def completed(state: str | None) -> bool:
    return words(state) == COMPLETED


def registered(state: str | None, status: str | None) -> bool:
    """Registration finished and succeeded: state Completed, status Success."""
    return completed(state) and words(status) == SUCCESS


def trying(state: str | None, status: str | None) -> bool:
    """A card with a fabric whose registration has not succeeded: not started, in progress, or failed.

    A failed one reads Completed with NVML's error as its status (and often an
    all-zero UUID): it is as far from its domain as one still registering.
    """
    return has_fabric(state) and not registered(state, status)


def cluster_uuid(raw: str | None) -> str | None:
    """The domain UUID a card names, lower-cased; None for none: missing, N/A, or all zeros (no domain)."""
    text = words(raw)
    if text in MISSING_UUIDS or not text.replace("0", "").replace("-", ""):
        return None
    return text


def claimed_key(raw_uuid: str | None, clique_id: int | None) -> DomainKey | None:
    """The domain a card names, joined or not; None when it names none.

    A CliqueId that was not reported is 0, as ingestion has always keyed such a
    domain, so a card names the same domain before and after it joins.
    """
    uuid = cluster_uuid(raw_uuid)
    if uuid is None:
        return None
    return DomainKey(uuid, int(clique_id) if clique_id is not None else 0)


def claimed_text(raw_uuid: str | None, clique_id: int | None) -> str:
    """:func:`claimed_key` as the key text ``<ClusterUUID>/<CliqueId>``; empty when the card names no domain."""
    key = claimed_key(raw_uuid, clique_id)
    return "" if key is None else key.text


def joined_key(state: str | None, status: str | None, raw_uuid: str | None, clique_id: int | None) -> DomainKey | None:
    """The domain a card has joined: registered (Completed, Success) and naming one; None otherwise.

    An HGX box's cards register on the machine's own NVSwitch with an all-zero
    UUID: registered, but no domain. Degraded bandwidth still counts as joined.
    """
    if not registered(state, status):
        return None
    return claimed_key(raw_uuid, clique_id)


def expects_domain(state: str | None, status: str | None, raw_uuid: str | None, clique_id: int | None) -> bool:
    """Whether a card has, or should have, a multi-node domain: it names one, or is still trying to register.

    Left out: cards with no fabric, and cards registered on a machine's own
    NVSwitch (no domain to join). A card stuck registering is in, even when
    it cannot name its domain yet.
    """
    if not has_fabric(state):
        return False
    return claimed_key(raw_uuid, clique_id) is not None or not registered(state, status)
