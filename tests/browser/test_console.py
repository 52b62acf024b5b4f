"""The console in a real headless Chromium, against ``llmgw serve`` fed by the simulator.

The control plane runs embedded (its own PostgreSQL, in-memory channel layer: ingestion
and the websockets share the serve process). The simulated fleet runs in this
test process, in its own event loop on a background thread, so faults can be
injected while the browser watches. Screenshots go to test-artifacts/.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time

import pytest

from agent.simulator import fleet as F
from agent.simulator.runner import Simulation
from tests.browser.chromium import chromium, log_in, screenshot, wait_for
from tests.core.test_serve import Server

pytestmark = [pytest.mark.browser, pytest.mark.slow]

FLEET = "gb200-nvl72:1,h100-hgx:1,a100-mig:1,cpu:1"
TRAY = "nvl72-00-tray-03"


class SimThread:
    """A Simulation in an event loop of its own, on a daemon thread; faults are scheduled onto that loop."""

    def __init__(self, server: str, join_token: str, spec: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="simulator", daemon=True)
        self.thread.start()
        self.sim = Simulation(server, join_token, F.build_fleet(spec), heartbeat_interval_s=1.0, report_interval_s=15)
        self.run(self.sim.start())

    def run(self, coro, timeout: float = 90.0):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def fault(self, name: str, *args) -> None:
        """``fault("tray_leave", node)``: the simulator's fault, run on its loop (it starts tasks there)."""
        self.loop.call_soon_threadsafe(getattr(self.sim, name), *args)

    def stop(self) -> None:
        try:
            self.run(self.sim.stop(), timeout=30)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout=10)


@pytest.fixture(scope="module")
def control_plane(tmp_path_factory):
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per simulated heartbeat buries any failure
    server = Server(
        tmp_path_factory.mktemp("console"),
        LLMGW_EVERY_REACHABILITY="1",
        LLMGW_EVERY_PLAN_SCANS="2",
        LLMGW_NODE_GRACE_S="6",
        LLMGW_NODE_LOST_AFTER_S="600",
        LLMGW_DOMAIN_LOST_AFTER_S="600",
    )
    sim = None
    try:
        server.wait_ready()
        join = (server.data / "join-token").read_text().strip()
        sim = SimThread(f"http://{server.admin}", join, FLEET)
        sim.run(sim.sim.wait_registered(timeout=90))
        yield server, sim
    finally:
        if sim is not None:
            sim.stop()
        assert server.stop() == 0, server.log.read_text()[-3000:]


@pytest.fixture(scope="module")
def operator_browser(control_plane):
    server, _ = control_plane
    base = f"http://{server.admin}"
    with chromium() as driver:
        log_in(driver, base, "admin", (server.data / "admin-password").read_text().strip())
        yield driver, base


def open_live(driver, url: str) -> None:
    driver.get(url)
    wait_for(lambda: badge(driver) == "live", what=f"{url} to go live (badge says {badge(driver)!r})")
    # Set in this document only: a reload would lose it, so it proves the page patched itself.
    driver.execute_script("window.__sameDocument = 'yes'")


def badge(driver) -> str:
    return driver.execute_script("var b = document.getElementById('live-badge'); return b && b.dataset.liveState")


def chip_states(driver) -> dict[str, str]:
    return driver.execute_script(
        "var out = {}; document.querySelectorAll('[data-gpu][data-state]').forEach("
        "function (c) { out[c.dataset.gpu] = c.dataset.state; }); return out;"
    )


def same_document(driver) -> bool:
    return driver.execute_script("return window.__sameDocument") == "yes"


def test_a_tray_leaving_turns_exactly_its_chips_red_on_an_open_rack_page(operator_browser, control_plane):
    driver, base = operator_browser
    _, sim = control_plane
    open_live(driver, f"{base}/admin/nvlink/")
    wait_for(
        lambda: list(chip_states(driver).values()).count("joined") == 72,
        timeout=60,
        what="72 joined chips",
    )
    assert len(chip_states(driver)) == 72
    screenshot(driver, "nvlink-rack-all-joined")

    started = time.monotonic()
    sim.fault("tray_leave", TRAY)
    expected = {f"{TRAY}/{i}" for i in range(4)}
    wait_for(
        lambda: {g for g, s in chip_states(driver).items() if s == "down"} == expected,
        timeout=15,
        every=0.05,
        what=f"{TRAY}'s four chips to turn red",
    )
    took = time.monotonic() - started
    states = chip_states(driver)
    assert list(states.values()).count("joined") == 68, "every other chip stays joined"
    assert same_document(driver), "patched in place, not reloaded"
    reasons = driver.execute_script(
        f"var li = document.querySelector('ul.out li[data-tray=\"{TRAY}\"]'); return li && li.textContent"
    )
    assert reasons and "fabric state In Progress" in reasons
    print(f"tray fault to red chips on the open page: {took:.2f} s")
    # The fault's way to the page: the agent's report, ingestion, the push, the fragment fetch.
    # A second is what it takes on an idle machine; the bound leaves room for a loaded CI box.
    assert took < 5.0, f"took {took:.1f} s"
    screenshot(driver, "nvlink-rack-tray-out")

    sim.fault("tray_rejoin", TRAY)
    wait_for(lambda: list(chip_states(driver).values()).count("joined") == 72, timeout=15, what="the tray back")
    assert same_document(driver)


def test_a_node_page_shows_the_nvlink_matrix_and_mig_instances(operator_browser):
    driver, base = operator_browser
    open_live(driver, f"{base}/admin/nodes/hgx-000/")
    cells = driver.execute_script(
        "return Array.from(document.querySelectorAll('table.matrix td')).map(function (c) { return c.dataset.link; })"
    )
    assert cells.count("nv") == 56 and cells.count("self") == 8, "an HGX: every card reaches the seven others (NV18)"
    screenshot(driver, "node-hgx-000")

    open_live(driver, f"{base}/admin/nodes/mig-00/")
    rows = driver.execute_script(
        "return Array.from(document.querySelectorAll('table.mig tr[data-gpu]')).map(function (r) {"
        " return [r.cells[0].textContent, r.cells[1].textContent]; })"
    )
    assert rows[:2] == [["0/mig0", "a100-80g-mig-1g.20gb"], ["0/mig1", "a100-80g-mig-1g.20gb"]]
    screenshot(driver, "node-mig-00")


def test_cordon_from_the_page_changes_the_state(operator_browser):
    from selenium.webdriver.common.by import By

    driver, base = operator_browser
    open_live(driver, f"{base}/admin/nodes/cpu-00/")
    driver.find_element(By.CSS_SELECTOR, "button[value=cordon]").click()
    wait_for(lambda: "ready → cordoned" in driver.find_element(By.CSS_SELECTOR, "ul.messagelist").text)
    assert driver.find_element(By.CSS_SELECTOR, "[data-role=state]").text == "cordoned"
    driver.find_element(By.CSS_SELECTOR, "button[value=uncordon]").click()
    wait_for(lambda: driver.find_element(By.CSS_SELECTOR, "[data-role=state]").text == "ready")


def test_a_node_going_silent_changes_on_the_open_fleet_page(operator_browser, control_plane):
    driver, base = operator_browser
    _, sim = control_plane

    def tile() -> str:
        return driver.execute_script(
            "var t = document.querySelector('.tile[data-node=\"cpu-00\"]'); return t && t.dataset.condition"
        )

    open_live(driver, f"{base}/admin/fleet/")
    wait_for(lambda: tile() == "ready", what="cpu-00 ready")
    screenshot(driver, "fleet")
    sim.fault("kill", "cpu-00")
    wait_for(lambda: tile() == "unreachable", timeout=30, what="cpu-00 to turn unreachable on the page")
    assert same_document(driver)
    screenshot(driver, "fleet-node-unreachable")
    sim.fault("revive", "cpu-00")
    wait_for(lambda: tile() == "ready", timeout=30, what="cpu-00 back")


def test_the_fabric_pages_show_the_fabric_and_its_scanned_map(operator_browser):
    driver, base = operator_browser
    open_live(driver, f"{base}/admin/fabrics/")
    link = wait_for(
        lambda: driver.execute_script("var a = document.querySelector('article.fabric h2 a'); return a && a.href"),
        what="a fabric",
    )
    screenshot(driver, "fabrics")
    open_live(driver, link)
    # A node assigned the scan (planned every 2 s here) gets it in the answer to its next full report
    # (every 15 s here) and uploads the map; the page says there is no map until the scan lands, and
    # draws it then without a reload (its periodic re-fetch: a scan's upload is not published).
    try:
        wait_for(
            lambda: driver.execute_script(
                "return document.querySelectorAll('svg.topology rect.host[data-node]').length"
            ),
            timeout=45,
            what="our adapters on the map",
        )
    except AssertionError:
        said = driver.execute_script("var p = document.querySelector('[data-scan]'); return p && p.textContent")
        raise AssertionError(f"no map of our adapters; the page says: {said}") from None
    screenshot(driver, "fabric-topology")


def test_the_models_pages_show_a_model_added_through_the_api(operator_browser, control_plane):
    import httpx

    from tests.api.fleet import MODEL

    driver, base = operator_browser
    server, _ = control_plane
    open_live(driver, f"{base}/admin/models/")
    token = (server.data / "admin-token").read_text().strip()
    added = httpx.post(f"{base}/api/v1/models", json=MODEL, headers={"Authorization": f"Bearer {token}"})
    assert added.status_code == 201, added.text
    # Nothing publishes catalog changes yet; the page's periodic re-fetch (10 s) brings the model in.
    wait_for(
        lambda: driver.execute_script("return !!document.querySelector('tr[data-model=\"llama-8b\"]')"),
        timeout=25,
        what="the new model on the open page",
    )
    assert same_document(driver)
    screenshot(driver, "models")
    open_live(driver, f"{base}/admin/models/llama-8b/")
    assert "h100" in driver.find_element("css selector", "section.live").text
    screenshot(driver, "model-llama-8b")


def test_an_anonymous_browser_is_sent_to_the_login_and_its_socket_refused(control_plane):
    server, _ = control_plane
    base = f"http://{server.admin}"
    with chromium() as driver:
        driver.get(f"{base}/admin/nvlink/")
        assert "/admin/login/?next=/admin/nvlink/" in driver.current_url
        screenshot(driver, "anonymous-login")
        driver.set_script_timeout(10)
        code = driver.execute_async_script(
            "var done = arguments[arguments.length - 1];"
            "var ws = new WebSocket('ws://' + location.host + '/ws/console/fleet/');"
            "ws.onmessage = function () { done('heard something'); };"
            "ws.onclose = function (e) { done(e.code); };"
        )
        assert code == 4403
