"""A process's live updates held for a moment and sent as one message a window (dashboard.live's outbox).

The storm these guard against: ten thousand nodes registering sent one layer
message each, every page's channel in Redis filled and dropped the rest, and
the pages heard of registrations 7 to 80 seconds late (bench/scale.py).
"""

from __future__ import annotations

import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dashboard import live
from tests.livespy import IN_MEMORY, group_sends, updates_sent


@pytest.fixture(autouse=True)
def in_memory_layer(settings):
    settings.CHANNEL_LAYERS = IN_MEMORY


def report(k: int) -> live.Update:
    return live.Update(kind="node.report", subject=f"n-{k:05d}", data={"node": k})


def wait_for(predicate, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "the outbox never sent what it held"
        time.sleep(0.01)


def test_a_storm_is_the_first_update_at_once_then_one_message_a_window_and_loses_nothing(monkeypatch):
    sent = group_sends(monkeypatch)
    started = time.monotonic()
    for k in range(600):
        assert live.publish([live.fleet_group()], report(k))
        time.sleep(0.001)
    last_published = time.monotonic()
    wait_for(lambda: sum(1 if m["kind"] != live.BATCH else len(m["data"]["updates"]) for _, m in sent) == 600)
    sent_by = time.monotonic()
    assert sent[0][1] == {"type": live.MESSAGE_TYPE, **report(0)}, "the first after a quiet spell goes at once"
    assert [m["kind"] for _, m in sent[1:]] == [live.BATCH] * (len(sent) - 1)
    assert [m["subject"] for _, m in updates_sent(sent)] == [f"n-{k:05d}" for k in range(600)], "all, once, in order"
    # One message a window at most, whatever the rate (plus the first): a page's channel cannot fill.
    assert len(sent) <= (sent_by - started) / live.FRAME_EVERY_S + 2, (len(sent), sent_by - started)
    # The last waited for its window and no longer (the slack is a loaded test machine's).
    assert sent_by - last_published < live.FRAME_EVERY_S + 0.75


def test_updates_from_many_threads_are_each_sent_once(monkeypatch):
    sent = group_sends(monkeypatch)

    def publisher(t: int) -> None:
        for k in range(100):
            live.publish([live.fleet_group()], report(t * 1000 + k))

    threads = [threading.Thread(target=publisher, args=(t,)) for t in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    told = [m["subject"] for _, m in updates_sent(sent)]
    assert sorted(told) == sorted(f"n-{t * 1000 + k:05d}" for t in range(8) for k in range(100))
    for t in range(8):
        mine = [s for s in told if int(s[2:]) // 1000 == t]
        assert mine == sorted(mine), "each thread's updates in the order it published them"


def test_more_than_a_message_carries_in_one_window_is_one_resync(monkeypatch):
    monkeypatch.setattr(live, "FRAME_EVERY_S", 5.0)
    sent = group_sends(monkeypatch)
    live.publish([live.fleet_group()], report(0))
    live.publish_many([([live.fleet_group()], report(k)) for k in range(1, live.MOST_IN_A_MESSAGE + 2)])
    live.outbox.flush()
    assert [m["kind"] for _, m in sent] == ["node.report", live.RESYNC]
    assert sent[1][1]["data"] == {"held": live.MOST_IN_A_MESSAGE + 1}


def test_many_updates_published_together_after_a_quiet_spell_are_one_message(monkeypatch):
    sent = group_sends(monkeypatch)
    live.publish_many([([live.fleet_group()], report(k)) for k in range(300)])
    assert len(sent) == 1 and sent[0][1]["kind"] == live.BATCH
    assert len(sent[0][1]["data"]["updates"]) == 300


def test_a_layer_that_fails_at_the_windows_end_pauses_publishing_and_loses_no_caller(monkeypatch, caplog):
    monkeypatch.setattr(live, "FRAME_EVERY_S", 0.2)
    live.publish([live.fleet_group()], report(0))

    class Down:
        async def group_send(self, group, message):
            raise ConnectionError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")

    monkeypatch.setattr(live, "get_channel_layer", lambda: Down())
    assert live.publish([live.fleet_group()], report(1)), "held: the caller is not told of a send not yet tried"
    wait_for(live.breaker.open)
    assert not live.publish([live.fleet_group()], report(2)), "paused: dropped at once, nothing waits"
    assert live.outbox.held == []


def test_a_forked_child_starts_with_an_empty_outbox(monkeypatch):
    monkeypatch.setattr(live, "FRAME_EVERY_S", 60.0)
    sent = group_sends(monkeypatch)
    live.publish([live.fleet_group()], report(0))
    live.publish([live.fleet_group()], report(1))
    assert len(live.outbox.held) == 1
    monkeypatch.setattr(live.outbox, "pid", -1)  # as a child of the prefork pool sees its parent's outbox
    live.publish([live.fleet_group()], report(2))
    assert [m["subject"] for _, m in sent] == ["n-00000", "n-00002"], "the parent's held update is the parent's"


groups = st.lists(st.sampled_from(["fleet", "node-a", "rack-b"]), min_size=1, max_size=3, unique=True)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(groups, st.integers(0, 99)), max_size=60), st.integers(1, 20))
def test_coalescing_keeps_each_groups_updates_in_order_or_counts_them(held, bound):
    updates = [(g, report(k)) for g, k in held]
    original = live.MOST_IN_A_MESSAGE
    live.MOST_IN_A_MESSAGE = bound
    try:
        out = live.coalesced(updates)
    finally:
        live.MOST_IN_A_MESSAGE = original
    expected: dict[str, list[live.Update]] = {}
    for g, update in updates:
        for group in g:
            expected.setdefault(group, []).append(update)
    assert sorted(group for gs, _ in out for group in gs) == sorted(expected), "one message per group"
    for gs, message in out:
        assert len(gs) == 1
        want = expected[gs[0]]
        if message["kind"] == live.RESYNC:
            assert len(want) > bound and message["data"] == {"held": len(want)}
        elif message["kind"] == live.BATCH:
            assert 1 < len(want) <= bound and message["data"]["updates"] == want
        else:
            assert want == [message]
