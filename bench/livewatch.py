"""An open console page during a benchmark: its websocket's frames, and how late each change reached it.

The page is the fleet page's socket (``/ws/console/fleet/``), logged in
through the admin's own login form as a browser would, read on a thread of
its own so the benchmark's event loop is not slowed by it. What it measures
is issue 16's "live updates during a heartbeat storm": frames a second (the
socket coalesces, dashboard/consumers.py) and, for each node the benchmark
registered, how long after its registration was answered the page was told.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import websocket

from bench.ingest import pct


def session_cookie(admin: str, data: Path) -> str:
    """The admin's session, from the login form (``data`` is serve's data dir, where its password is)."""
    password = (data / "admin-password").read_text().strip()
    with httpx.Client(base_url=f"http://{admin}", timeout=30) as http:
        page = http.get("/admin/login/")
        csrf = page.text.split('name="csrfmiddlewaretoken" value="', 1)[1].split('"', 1)[0]
        done = http.post(
            "/admin/login/?next=/admin/",
            data={"csrfmiddlewaretoken": csrf, "username": "admin", "password": password, "next": "/admin/"},
            headers={"Referer": f"http://{admin}/admin/login/"},
        )
        if done.status_code != 302:
            raise SystemExit(f"could not log in to the console: {done.status_code}")
        return http.cookies["sessionid"]


class LiveWatch:
    """The fleet page's socket, read until stopped: each frame with when it arrived (monotonic)."""

    def __init__(self, admin: str, data: Path) -> None:
        self.url = f"ws://{admin}/ws/console/fleet/"
        self.cookie = f"sessionid={session_cookie(admin, data)}"
        self.frames: list[tuple[float, dict]] = []
        self.closes: list[tuple[float, str]] = []
        """Each time the socket closed before the benchmark stopped it: when, and why."""
        self.reopened: list[float] = []
        """When the socket opened again after a close: the console's page fetches every part then (live.js)."""
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self.run, name="live-watch", daemon=True)

    def run(self) -> None:
        while not self.stopping.is_set():
            try:
                sock = websocket.create_connection(self.url, timeout=1, cookie=self.cookie)
            except Exception:  # noqa: BLE001 - the page retries, as the console's script does
                time.sleep(0.5)
                continue
            if self.closes:
                self.reopened.append(time.monotonic())
            why = "the server closed it"
            try:
                while not self.stopping.is_set():
                    try:
                        text = sock.recv()
                    except websocket.WebSocketTimeoutException:
                        continue
                    if not text:
                        why = f"the server closed it ({sock.status})"
                        break
                    self.frames.append((time.monotonic(), json.loads(text)))
            except Exception as exc:  # noqa: BLE001 - closed or broken: counted, and opened again
                why = f"{type(exc).__name__}: {exc}"
            finally:
                if not self.stopping.is_set():
                    self.closes.append((time.monotonic(), why))
                sock.close()

    def __enter__(self) -> LiveWatch:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        self.thread.join(10)

    def figures(self, registered_at: dict[str, float]) -> dict:
        """Frames a second at the busiest second, and how late each registered node reached the page."""
        per_second = Counter(int(t) for t, _ in self.frames)
        told: dict[str, float] = {}
        # Opened again after a close, the page fetches every part, as a resync makes it.
        resyncs: list[float] = list(self.reopened)
        for t, frame in self.frames:
            kind = frame.get("kind")
            if kind == "resync":
                resyncs.append(t)
            updates = frame.get("data", {}).get("updates", []) if kind == "batch" else [frame]
            for update in updates:
                if update.get("kind") == "node.registered":
                    told.setdefault(update.get("subject"), t)
        late = []
        for name, at in registered_at.items():
            # A resync after the registration tells the page too: it fetches everything.
            heard = min([t for t in (told.get(name),) if t is not None] + [t for t in resyncs if t >= at], default=None)
            late.append(None if heard is None else max(0.0, heard - at))
        heard_late = [x for x in late if x is not None]
        return {
            "live_frames_max_per_s": max(per_second.values(), default=0),
            "live_frames": (len(self.frames), sum(1 for _, f in self.frames if f.get("kind") == "resync")),
            "live_late_p99_ms": pct(heard_late, 99) if heard_late else float("nan"),
            "live_late_max_ms": max(heard_late, default=float("nan")) * 1000,
            "live_never_told": sum(1 for x in late if x is None),
            "live_reconnects": len(self.closes),
            "live_closes": sorted({why for _, why in self.closes}),
        }
