"""live.js in a real Chromium, fed frames by hand: which parts of a page each kind of frame fetches again.

No server: the page is written into a blank document, the browser's own
WebSocket and fetch are replaced by recorders, and live.js runs on it as
shipped. So each kind of frame the sockets send (a lone message, a batch, a
resync: dashboard/consumers.py) is checked exactly, which a page fed by a
real fleet can only show when the timing happens to make one.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.browser.chromium import chromium

pytestmark = [pytest.mark.browser]

LIVE_JS = Path(__file__).resolve().parents[2] / "dashboard" / "static" / "dashboard" / "live.js"

PAGE = """
<span id="live-badge" data-live-socket="/ws/console/fleet/"><span class="words"></span></span>
<section data-live-fragment="/part/a" data-live-nodes="a"></section>
<section data-live-fragment="/part/b" data-live-nodes="b"></section>
<section data-live-fragment="/part/c" data-live-nodes="c"></section>
<section data-live-fragment="/part/all" data-live-nodes="*">
  <div data-live-fragment="/part/inner" data-live-nodes="a"></div>
</section>
"""

# Recorders in place of the network: every fetch is logged and answered with the part as it is.
STUBS = """
window.__fetched = [];
window.__sockets = [];
window.WebSocket = function (url) { this.url = url; window.__sockets.push(this); };
window.fetch = function (url) {
  window.__fetched.push(url);
  var el = document.querySelector('[data-live-fragment="' + url + '"]');
  var html = el ? el.outerHTML : "";
  var answer = { ok: true, redirected: false, status: 200 };
  answer.text = function () { return Promise.resolve(html); };
  return Promise.resolve(answer);
};
"""


@pytest.fixture(scope="module")
def page():
    with chromium(800, 600) as driver:
        driver.get("about:blank")
        driver.execute_script("document.body.innerHTML = arguments[0];" + STUBS, PAGE)
        driver.execute_script(LIVE_JS.read_text())
        driver.execute_script("window.__sockets[0].onopen(); window.__fetched = [];")
        yield driver


def fetched_after(driver, frame: dict) -> list[str]:
    """The parts fetched once the page heard ``frame``, in order (after the fetches have settled)."""
    return driver.execute_async_script(
        """
        var done = arguments[arguments.length - 1];
        window.__fetched = [];
        window.__sockets[0].onmessage({ data: arguments[0] });
        setTimeout(function () { done(window.__fetched); }, 100);
        """,
        json.dumps(frame),
    )


def report(node: str) -> dict:
    return {"kind": "node.report", "subject": node, "data": {"node": 1, "fields": ["load"]}}


def test_a_lone_message_fetches_its_nodes_parts_and_the_fleet_wide_one(page):
    assert sorted(fetched_after(page, report("c"))) == ["/part/all", "/part/c"]


def test_a_batch_fetches_each_part_its_messages_name_once_and_only_the_outermost_of_nested_parts(page):
    frame = {"kind": "batch", "subject": "fleet", "data": {"updates": [report("a"), report("b"), report("a")]}}
    got = fetched_after(page, frame)
    assert sorted(got) == ["/part/a", "/part/all", "/part/b"], got


def test_a_resync_fetches_every_outermost_part(page):
    got = fetched_after(page, {"kind": "resync", "subject": "fleet", "data": {"held": 500}})
    assert sorted(got) == ["/part/a", "/part/all", "/part/b", "/part/c"], got


def test_a_frame_that_is_not_json_fetches_nothing(page):
    assert (
        page.execute_async_script(
            """
        var done = arguments[arguments.length - 1];
        window.__fetched = [];
        window.__sockets[0].onmessage({ data: "{not json" });
        setTimeout(function () { done(window.__fetched); }, 100);
        """
        )
        == []
    )
