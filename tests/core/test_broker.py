"""The embedded broker hands a reader whole messages while a writer is still adding more."""

from __future__ import annotations

import threading
from queue import Empty

import pytest
from kombu import Connection

import llmgw.celery  # noqa: F401 - points filesystem:// at llmgw.broker
from llmgw import broker


def connection(folder) -> Connection:
    (folder / "queue").mkdir(exist_ok=True)
    (folder / "processed").mkdir(exist_ok=True)
    return Connection(
        "filesystem://",
        transport_options={
            "data_folder_in": str(folder / "queue"),
            "data_folder_out": str(folder / "queue"),
            "processed_folder": str(folder / "processed"),
            "store_processed": False,
        },
    )


def test_filesystem_urls_use_the_whole_message_transport(tmp_path):
    with connection(tmp_path) as conn:
        assert isinstance(conn.transport, broker.Transport)


def test_a_reader_racing_a_writer_gets_every_message_whole(tmp_path):
    count = 200
    big = "x" * 1_000_000  # large enough that a write takes more than one system call
    got: list[dict] = []
    errors: list[BaseException] = []
    written = threading.Event()

    def write() -> None:
        with connection(tmp_path) as conn:
            channel = conn.default_channel
            for i in range(count):
                channel._put("q", {"i": i, "body": big})
        written.set()

    def read() -> None:
        with connection(tmp_path) as conn:
            channel = conn.default_channel
            while len(got) < count:
                try:
                    got.append(channel._get("q"))
                except Empty:
                    if written.is_set() and len(got) < count:
                        continue
                except Exception as exc:  # noqa: BLE001 - a torn message is what this test looks for
                    errors.append(exc)
                    return

    threads = [threading.Thread(target=write), threading.Thread(target=read)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors[:3]
    assert sorted(m["i"] for m in got) == list(range(count))
    assert all(m["body"] == big for m in got)


def test_while_a_message_is_being_written_no_reader_can_see_it(tmp_path, monkeypatch):
    seen_while_writing: list[list[str]] = []
    real_open = open

    class Spy:
        def __init__(self, f) -> None:
            self.f = f

        def write(self, data):
            # What a reader would list at this instant: nothing of the queue's.
            seen_while_writing.append([n for n in (tmp_path / "queue").iterdir() if n.name.endswith(".q.msg")])
            return self.f.write(data)

        def __enter__(self):
            self.f.__enter__()
            return self

        def __exit__(self, *exc):
            return self.f.__exit__(*exc)

    monkeypatch.setattr(broker, "open", lambda *a, **k: Spy(real_open(*a, **k)), raising=False)
    with connection(tmp_path) as conn:
        conn.default_channel._put("q", {"hello": 1})
        assert seen_while_writing == [[]]
        assert conn.default_channel._get("q") == {"hello": 1}


def test_a_file_that_is_not_a_message_is_dropped_and_the_next_one_read(tmp_path, caplog):
    with connection(tmp_path) as conn:
        channel = conn.default_channel
        (tmp_path / "queue" / "0_torn.q.msg").write_bytes(b'{"half": ')
        channel._put("q", {"whole": True})
        with pytest.raises(Empty):
            channel._get("q")
        assert "not a message" in caplog.text
        assert channel._get("q") == {"whole": True}
