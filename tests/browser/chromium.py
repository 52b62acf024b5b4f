"""A real headless Chromium (Debian's), driven through its matching chromedriver with Selenium.

Selenium is told where both binaries are, so it never looks for or downloads
a browser or a driver of its own. Every browser gets a fresh profile
directory, and its screenshots go under test-artifacts/ in the repository
(git-ignored) for a person to look at.
"""

from __future__ import annotations

import re
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)


def require_chromium() -> None:
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not Path(p).exists()]
    if missing:
        pytest.fail(
            f"{', '.join(missing)} missing: run scripts/ensure-services (it installs chromium and chromium-driver)"
        )


@contextmanager
def chromium(width: int = 1600, height: int = 1200) -> Iterator:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    require_chromium()
    profile = tempfile.mkdtemp(prefix="llmgw-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (*FLAGS, f"--user-data-dir={profile}", f"--window-size={width},{height}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def screenshot(driver, name: str, full_page: bool = True) -> Path:
    """Save the page as test-artifacts/<name>.png, the whole page tall when ``full_page``."""
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / (re.sub(r"[^A-Za-z0-9_.-]", "_", name) + ".png")
    if full_page:
        height = driver.execute_script("return Math.max(document.body.scrollHeight, 800)")
        width = driver.execute_script("return Math.max(document.body.scrollWidth, 1200)")
        driver.set_window_size(min(width, 2400), min(height + 140, 6000))
    driver.save_screenshot(str(path))
    return path


def log_in(driver, base: str, username: str, password: str, then: str = "/admin/") -> None:
    from selenium.webdriver.common.by import By

    driver.get(f"{base}/admin/login/?next={then}")
    driver.find_element(By.NAME, "username").send_keys(username)
    driver.find_element(By.NAME, "password").send_keys(password)
    driver.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
    wait_for(lambda: "/admin/login/" not in driver.current_url, what="the login to go through")


def wait_for(check: Callable[[], object], timeout: float = 20.0, what: str = "condition", every: float = 0.1):
    """Poll ``check`` until it returns something truthy; that value is returned."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = check()
        except Exception as exc:  # noqa: BLE001 - a page mid-swap raises stale-element errors; try again
            last_error = exc
            value = None
        if value:
            return value
        time.sleep(every)
    raise AssertionError(
        f"timed out after {timeout:.0f} s waiting for {what}" + (f": {last_error}" if last_error else "")
    )
