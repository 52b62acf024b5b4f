"""Xid events as they happen: the kernel line parser on real lines, NVML's event path on the fake NVML."""

from __future__ import annotations

import threading
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from agent.discovery import nvidia_smi as smi
from agent.discovery import xids as X
from agent.discovery.nvml_fake import FakeNvml
from tests.captures import read

CAPTURES = Path(__file__).resolve().parent / "captures"
JOURNAL = (CAPTURES / "kernel-journal_xid79_nvidia-bug-report.txt").read_text()
DMESG_CTIME = (CAPTURES / "kernel-dmesg-ctime_xid13-31-109_gpud.txt").read_text()
H100 = "nvidia-smi-q-x_h100-80gb-hbm3-x8_hgx_drv580.105.08_fabric-zero-uuid.xml"


def parsed(text: str) -> list[X.KernelXid]:
    return [x for x in map(X.parse_kernel_line, text.splitlines()) if x is not None]


def test_a_real_journal_line_gives_the_card_the_code_the_words_and_the_uptime():
    (xid,) = parsed(JOURNAL)  # the driver's other lines about the same card are not Xids
    assert xid.slot == (0, 1, 0) and xid.code == 79
    assert xid.message == "GPU has fallen off the bus."
    assert xid.uptime_s == 65.315783 and xid.sequence is None


def test_real_dmesg_ctime_lines_give_every_xid_and_skip_the_rest():
    found = parsed(DMESG_CTIME)
    assert [x.code for x in found] == [13, 13, 13, 109, 31, 109]
    assert {x.slot for x in found} == {(0, 0xCB, 0)}
    assert all(x.uptime_s is None for x in found), "a wall-clock prefix is no uptime"
    assert found[3].message == "Ch 00000008, errorString CTX SWITCH TIMEOUT, Info 0x58005"


def test_a_kmsg_record_of_a_real_line_gives_its_sequence_and_microseconds():
    body = JOURNAL.splitlines()[3].split("] ", 1)[1]
    xid = X.parse_kernel_line(f"4,1234,65315783,-;{body}\n")
    assert (xid.sequence, xid.uptime_s, xid.code, xid.slot) == (1234, 65.315783, 79, (0, 1, 0))


@given(st.text(max_size=300))
@settings(max_examples=500)
def test_any_line_parses_or_is_skipped_without_raising(line):
    xid = X.parse_kernel_line(line)
    assert xid is None or "NVRM: Xid (PCI:" in line


words = st.text(st.characters(min_codepoint=32, max_codepoint=126, exclude_characters="\n\r="), max_size=80)


@given(
    st.integers(0, 7),
    st.integers(0, 2**40),
    st.integers(0, 2**50),
    st.integers(0, 0xFFFF),
    st.integers(0, 0xFF),
    st.integers(0, 0x1F),
    st.integers(0, 2**31),
    words,
)
@settings(max_examples=500)
def test_a_kmsg_record_parses_back_to_what_was_written(prio, seq, usec, dom, bus, dev, code, message):
    line = f"{prio},{seq},{usec},-;NVRM: Xid (PCI:{dom:04x}:{bus:02x}:{dev:02x}): {code}, pid=1, name=x, {message}"
    xid = X.parse_kernel_line(line)
    assert (xid.sequence, xid.slot, xid.code) == (seq, (dom, bus, dev), code)
    assert xid.uptime_s == usec / 1_000_000
    assert xid.message == message.strip()


def test_following_kmsg_dates_each_xid_from_boot_and_keeps_the_newest_per_card():
    body = JOURNAL.splitlines()[3].split("] ", 1)[1]
    records = [f"6,{i},{10_000_000 + i},-;{body}" for i in range(40)] + ["6,99,1,-;usb 1-1: new device"]
    recent, stop = X.RecentXids(), threading.Event()

    def read_one():
        if records:
            return records.pop(0)
        stop.set()
        return None

    X.follow_kmsg(read_one, recent, stop, booted=1_700_000_000.0, wait_s=0)
    got = recent.for_card("00000000:01:00.0")
    assert len(got) == X.MAX_XIDS
    assert got[-1] == {"code": 79, "at": 1_700_000_010.0, "message": "GPU has fallen off the bus."}
    entries = [{"index": 0, "pci_bus": "00000000:01:00.0"}, {"index": 1, "pci_bus": "00000000:02:00.0"}]
    recent.attach(entries)
    assert len(entries[0]["xids"]) == X.MAX_XIDS and entries[1]["xids"] == []


def _fake() -> FakeNvml:
    return FakeNvml(smi.parse_xml(read(H100)))


def test_nvml_events_reach_the_card_they_name():
    fake, recent, stop = _fake(), X.RecentXids(), threading.Event()
    fake.xid_queue = [(2, 79), (2, 48), (5, 94)]
    watcher = threading.Thread(target=X.watch_nvml, args=(fake, recent, stop, 10))
    watcher.start()
    try:
        card2 = fake.pci_bus_id(fake.handle(2))
        deadline = threading.Event()
        for _ in range(200):
            if len(recent.for_card(card2)) == 2:
                break
            deadline.wait(0.01)
    finally:
        stop.set()
        watcher.join(5)
    assert [x["code"] for x in recent.for_card(card2)] == [79, 48]
    assert [x["code"] for x in recent.for_card(fake.pci_bus_id(fake.handle(5)))] == [94]
    assert recent.source == "nvml"
    assert fake.event_sets_open == 0, "the event set is freed when the watcher stops"


def test_a_driver_without_events_says_so_at_once_so_the_kernel_log_is_read():
    fake, recent = _fake(), X.RecentXids()
    fake.events_supported = False
    assert X.watch_nvml(fake, recent, threading.Event(), 10) is False
    assert recent.source == ""


def test_without_nvml_events_the_watcher_follows_the_kernel_log(tmp_path):
    fake, recent, stop = _fake(), X.RecentXids(), threading.Event()
    fake.events_supported = False
    kmsg = tmp_path / "kmsg"
    kmsg.write_text("")  # read from its end: what was there before was dmesg's
    asked = []
    recent.on_add = lambda: (asked.append(1), stop.set())
    watcher = threading.Thread(target=X.watch, args=(recent, stop), kwargs={"api": fake, "kmsg": str(kmsg)})
    watcher.start()
    for _ in range(100):
        if recent.source:
            break
        stop.wait(0.01)
    with kmsg.open("a") as f:
        f.write("4,7,65315783,-;NVRM: Xid (PCI:0000:01:00): 79, pid=1, name=x, GPU has fallen off the bus.")
    watcher.join(5)
    stop.set()
    assert recent.source == "kmsg" and asked == [1]
    assert [x["code"] for x in recent.for_card("00000000:01:00.0")] == [79]


def test_when_neither_can_be_read_the_report_says_why(tmp_path):
    recent = X.RecentXids()
    X.watch(recent, threading.Event(), use_nvml=False, kmsg=str(tmp_path / "none"))
    assert recent.problem.startswith("Xid events: NVML events unavailable and")
