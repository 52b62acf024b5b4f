"""Xid events read as they happen: NVML's event API where the driver allows, the kernel log otherwise.

The driver reports each Xid twice: to NVML clients that registered for
``nvmlEventTypeXidCriticalError`` (:func:`watch_nvml`), and as a kernel line
``NVRM: Xid (PCI:0000:cb:00): 13, pid=..., name=..., <words>`` (:func:`watch_kmsg`
follows ``/dev/kmsg``). Either watcher feeds a :class:`RecentXids`, which the report
reads: each card's recent Xids (code, time, words) go in its ``xids``, at most
:data:`MAX_XIDS` of them, newest kept (``inventory.report_schema`` bounds the same).

:func:`parse_kernel_line` is pure: one line of ``/dev/kmsg`` (``PRI,SEQ,USEC,FLAGS;MSG``),
of ``dmesg`` (``[  65.315783] MSG``, ``[Fri Aug 30 11:43:09 2024] MSG``) or of the journal
(``Mar 21 20:18:56 host kernel: [ 65.3] MSG``) in, the Xid it reports (or None) out.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import pynvml

from agent.discovery import gpus as G
from agent.discovery import nvml as N

# From the kernel log: each Xid line, and the cards they name.
_XID = re.compile(r"NVRM: Xid \(PCI:([0-9A-Fa-f]+):([0-9A-Fa-f]+):([0-9A-Fa-f]+)(?:\.[0-7])?\): (\d+), (.*)$")
_XID_WHO = re.compile(r"^(?:pid=[^,]*, )?(?:name=[^,]*, )?")


@dataclass(frozen=True)
class XidEvent:
    """One ``NVRM: Xid (PCI:0000:9b:00): 119, …`` kernel line."""

    domain: int
    bus: int
    device: int
    xid: int
    message: str


def parse_xid_log(text: str) -> list[XidEvent]:
    """Xid events from ``dmesg`` / journal text; lines that are not Xid reports are skipped."""
    events = []
    for line in (text or "").splitlines():
        m = _XID.search(line)
        if m:
            dom, bus, dev, xid, rest = m.groups()
            message = _XID_WHO.sub("", rest.strip())
            events.append(XidEvent(int(dom, 16), int(bus, 16), int(dev, 16), int(xid), message))
    return events


def apply_xids(cards: list[G.CardFacts], events: list[XidEvent]) -> list[str]:
    """Add each card's Xid errors to its health ("Xid 119 (5 times), last: …"); problems for unmatched ones."""
    problems: list[str] = []
    by_slot: dict[tuple[int, int, int], G.CardFacts] = {}
    for card in cards:
        if card.pci_bus:
            dom, bus, rest = card.pci_bus.split(":")
            by_slot[(int(dom, 16), int(bus, 16), int(rest.split(".")[0], 16))] = card
    seen: dict[tuple[int, int], list[XidEvent]] = {}
    for event in events:
        card = by_slot.get((event.domain, event.bus, event.device))
        if card is None:
            problems.append(
                f"Xid {event.xid} on PCI {event.domain:04x}:{event.bus:02x}:{event.device:02x}, no such GPU"
            )
            continue
        seen.setdefault((card.index, event.xid), []).append(event)
    for (index, xid), found in seen.items():
        card = next(c for c in cards if c.index == index)
        times = f" ({len(found)} times)" if len(found) > 1 else ""
        card.errors.append(f"Xid {xid}{times} in the kernel log, last: {found[-1].message}")
    return problems


MAX_XIDS = 32  # per card in a report: inventory.report_schema.MAX_XIDS
KMSG = "/dev/kmsg"
NVML_WAIT_MS = 1000  # how long one nvmlEventSetWait blocks, so a stop is noticed within a second

_KMSG_RECORD = re.compile(r"^(\d+),(\d+),(\d+),[^;]*;(.*)$")
_UPTIME = re.compile(r"\[\s*(\d+\.\d+)\]")
_XID_HEAD = re.compile(r"NVRM: Xid \(PCI:")
# Who the driver blames, with no words after it (a line cut short): no message at all.
_ONLY_WHO = re.compile(r"^(?:pid=[^,]*,\s*)?(?:name=[^,]*,?\s*)?$")


@dataclass(frozen=True)
class KernelXid:
    """One Xid kernel line: the card's PCI slot, the code, the driver's words, and when, as far as the line says.

    ``sequence`` is /dev/kmsg's record number (None from dmesg or the journal); ``uptime_s`` the
    kernel's timestamp in seconds since boot (None when the line carries none).
    """

    domain: int
    bus: int
    device: int
    code: int
    message: str
    sequence: int | None = None
    uptime_s: float | None = None

    @property
    def slot(self) -> tuple[int, int, int]:
        return (self.domain, self.bus, self.device)


def parse_kernel_line(line: str) -> KernelXid | None:
    """The Xid one kernel log line reports; None for any other line."""
    if not isinstance(line, str) or not _XID_HEAD.search(line):
        return None
    sequence = uptime = None
    text = line.rstrip("\r\n")
    record = _KMSG_RECORD.match(text)
    if record:
        sequence, uptime = int(record.group(2)), int(record.group(3)) / 1_000_000
        text = record.group(4)
    else:
        head = text[: _XID_HEAD.search(text).start()]
        stamp = _UPTIME.search(head)
        if stamp:
            uptime = float(stamp.group(1))
    events = parse_xid_log(text[_XID_HEAD.search(text).start() :])
    if not events:
        return None
    e = events[0]
    message = "" if _ONLY_WHO.match(e.message) else e.message.strip()
    return KernelXid(e.domain, e.bus, e.device, e.xid, message, sequence, uptime)


def slot_of(pci_bus: str) -> tuple[int, int, int] | None:
    """``00000000:CB:00.0`` (nvidia-smi, NVML) → (0, 0xcb, 0); None when it is not one."""
    try:
        dom, bus, rest = pci_bus.split(":")
        return (int(dom, 16), int(bus, 16), int(rest.split(".")[0], 16))
    except (AttributeError, ValueError):
        return None


class RecentXids:
    """Each card's recent Xids, by PCI slot, newest last; written by a watcher thread, read by the report."""

    def __init__(self, per_card: int = MAX_XIDS) -> None:
        self._lock = threading.Lock()
        self._by_slot: dict[tuple[int, int, int], deque[dict[str, Any]]] = {}
        self._per_card = per_card
        self.source = ""  # "nvml" or "kmsg": which watcher feeds it
        self.problem = ""  # why neither could, in words
        self.on_add: Callable[[], None] | None = None  # the agent asks for a report sooner

    def add(self, slot: tuple[int, int, int], code: int, at: float, message: str = "") -> None:
        with self._lock:
            events = self._by_slot.setdefault(slot, deque(maxlen=self._per_card))
            events.append({"code": int(code), "at": round(float(at), 3), "message": message[:500]})
        if self.on_add is not None:
            self.on_add()

    def for_card(self, pci_bus: str) -> list[dict[str, Any]]:
        slot = slot_of(pci_bus)
        with self._lock:
            return [dict(e) for e in self._by_slot.get(slot, ())] if slot else []

    def attach(self, gpus: Iterable[dict[str, Any]]) -> None:
        """Put each card's recent Xids in its report entry (``xids``); a MIG instance has its card's."""
        for entry in gpus:
            if entry.get("parent") is None and entry.get("pci_bus"):
                entry["xids"] = self.for_card(entry["pci_bus"])


def boot_time(clock: Callable[[], float] = time.time, uptime: Callable[[], float] = time.monotonic) -> float:
    """The wall-clock time of boot, to date /dev/kmsg's microseconds since boot (CLOCK_MONOTONIC's origin)."""
    return clock() - uptime()


def follow_kmsg(
    read: Callable[[], str | None], recent: RecentXids, stop: threading.Event, booted: float, wait_s: float = 0.5
) -> None:
    """Feed ``recent`` from kernel records: ``read`` returns one record, or None when none is waiting."""
    while not stop.is_set():
        record = read()
        if record is None:
            stop.wait(wait_s)
            continue
        xid = parse_kernel_line(record)
        if xid is not None:
            at = booted + xid.uptime_s if xid.uptime_s is not None else time.time()
            recent.add(xid.slot, xid.code, at, xid.message)


def kmsg_reader(path: str = KMSG) -> Callable[[], str | None]:
    """A reader of /dev/kmsg records from now on (older ones were read with dmesg at start)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    with contextlib.suppress(OSError):
        os.lseek(fd, 0, os.SEEK_END)

    def read() -> str | None:
        try:
            data = os.read(fd, 8192)  # /dev/kmsg hands out one record per read
        except BlockingIOError:
            return None
        except OSError as exc:
            if exc.errno == errno.EPIPE:  # records overwritten before we read them: go on from the next
                return ""
            raise
        return data.decode("utf-8", "replace") if data else None  # a plain file at its end: nothing yet

    return read


def watch_nvml(api: Any, recent: RecentXids, stop: threading.Event, wait_ms: int = NVML_WAIT_MS) -> bool:
    """Feed ``recent`` from NVML's Xid events until ``stop``; False at once when the driver refuses them."""
    try:
        handles = [api.handle(i) for i in range(api.device_count())]
        events = api.xid_event_set(handles)
    except pynvml.NVMLError:
        return False
    recent.source = "nvml"
    try:
        while not stop.is_set():
            try:
                got = api.wait_xid(events, wait_ms)
            except pynvml.NVMLError:
                stop.wait(wait_ms / 1000)
                continue
            if got is None:
                continue
            pci_bus, code = got
            slot = slot_of(pci_bus)
            if slot is not None:
                recent.add(slot, code, time.time(), "reported by NVML")
    finally:
        with contextlib.suppress(pynvml.NVMLError):
            api.free_event_set(events)
    return True


def watch(
    recent: RecentXids, stop: threading.Event, *, use_nvml: bool = True, api: Any = None, kmsg: str = KMSG
) -> None:
    """NVML's events where the driver allows, else /dev/kmsg; ``recent.problem`` says when neither can be read."""
    if use_nvml:
        nvml = api if api is not None else N.PynvmlApi()
        try:
            nvml.init()
        except pynvml.NVMLError:
            pass
        else:
            try:
                if watch_nvml(nvml, recent, stop):
                    return
            finally:
                with contextlib.suppress(pynvml.NVMLError):
                    nvml.shutdown()
    try:
        read = kmsg_reader(kmsg)
    except OSError as exc:
        recent.problem = f"Xid events: NVML events unavailable and {kmsg} unreadable ({exc.strerror or exc})"
        return
    recent.source = "kmsg"
    follow_kmsg(read, recent, stop, boot_time())


def start(*, use_nvml: bool = True, on_xid: Callable[[], None] | None = None) -> tuple[RecentXids, threading.Event]:
    """Watch for Xids in a daemon thread; the agent attaches ``recent`` to each report and sets the event to stop."""
    recent, stop = RecentXids(), threading.Event()
    recent.on_add = on_xid
    threading.Thread(target=watch, args=(recent, stop), kwargs={"use_nvml": use_nvml}, daemon=True, name="xids").start()
    return recent, stop
