"""The web dashboard in a real browser: Debian's chromium, headless, driven through chromedriver (selenium), against
a real Lockstep server on loopback with its broker loops running a real job on the local Vast API server.

Log in with a token (keyboard only), see the running job, open it and watch a new line of its live log arrive
(the command prints it only after the test has seen the first one), see the tenant's spend against its budget;
another tenant's job is not shown. On failure a screenshot and the page's HTML are written under the test's
temp dir.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from broker.api import create_app, start_server
from broker.config import BrokerConfig, RuntimeConfig, Settings
from broker.models import TERMINAL_STATES, Job, JobState, Role, Tenant
from broker.service import Lockstep
from broker.store import Store
from providers.vast import VastProvider
from providers.vast.config import VastConfig
from standins.vastapi.server import VastApiServer
from tests.conftest import missing
from tests.waiting import eventually

webdriver = pytest.importorskip("selenium.webdriver")
from selenium.webdriver.chrome.options import Options  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

INSTALLATION = "vdash"


@dataclass
class Site:
    svc: Lockstep
    url: str
    alice: str  # tenant alpha
    bob: str  # tenant beta
    tmp: Path

    async def submit(self, token: str, name: str, command: str) -> Job:
        spec = {"name": name, "gpu": ["RTX-4090", "RTX-3090"], "gpus": 1, "providers": ["vast"],
                "markets": ["on_demand"], "workload": {"hours": 1}, "disk_gb": 20, "command": command}
        async with httpx.AsyncClient(base_url=self.url, headers={"Authorization": f"Bearer {token}"},
                                     timeout=60) as c:
            r = await c.post("/v1/jobs", json=spec)
        assert r.status_code == 201, r.text
        return Job.model_validate(r.json())


@pytest.fixture
async def site(tmp_path: Path, vast_api: VastApiServer, vast_config: VastConfig) -> AsyncIterator[Site]:
    store = Store(f"sqlite:///{tmp_path / 'ui.db'}")
    store.migrate()
    store.create_tenant(Tenant(name="alpha", monthly_budget_usd=50.0))
    _, alice = store.create_token("alpha", Role.user)
    _, bob = store.create_token("beta", Role.user)
    settings = Settings(db_url=store.url, broker=BrokerConfig(installation=INSTALLATION, poll_interval_s=0.3,
                                                              place_interval_s=0.3),
                        runtime=RuntimeConfig(log_interval_s=0.3, grace_s=2.0))
    provider = VastProvider(vast_config.model_copy(update={"log_poll_s": 0.05}), installation=INSTALLATION)
    svc = Lockstep(settings, providers={"vast": provider}, store=store)
    runner, url = await start_server(create_app(svc, start_loops=True, close_service=False), "127.0.0.1", 0)
    try:
        yield Site(svc, url, alice, bob, tmp_path)
    finally:
        await runner.cleanup()
        await svc.aclose()


@pytest.fixture
def browser(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Any]:
    chromium, driver_path = shutil.which("chromium"), shutil.which("chromedriver")
    if not chromium or not driver_path:
        missing("Debian's chromium and chromium-driver are not installed (scripts/test installs them)")
    opts = Options()
    opts.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1366,900",
                "--disable-gpu"):
        opts.add_argument(arg)
    driver = webdriver.Chrome(service=Service(driver_path), options=opts)
    driver.set_page_load_timeout(60)
    yield driver
    shots = os.environ.get("LOCKSTEP_UI_SHOTS")  # a folder to keep the pages' screenshots in (to look at them)
    failed = getattr(request.node, "rep_call", None) is None or request.node.rep_call.failed
    if failed or shots:
        where = Path(shots) if shots and not failed else tmp_path
        where.mkdir(parents=True, exist_ok=True)
        driver.get_screenshot_as_file(str(where / "last-page.png"))
        (where / "last-page.html").write_text(driver.page_source)
        print(f"dashboard screenshot: {where / 'last-page.png'}")
    driver.quit()


async def _in(fn: Any, *args: Any) -> Any:
    """A blocking browser call, off the event loop (the server under test runs on it)."""
    return await asyncio.to_thread(fn, *args)


def _wait(driver: Any, what: Any, limit_s: float = 60) -> Any:
    return WebDriverWait(driver, limit_s, poll_frequency=0.2).until(what)


@pytest.mark.timeout(300)
async def test_log_in_see_the_running_job_follow_its_log_and_the_spend(site: Site, browser: Any) -> None:
    go, end = site.tmp / "go", site.tmp / "end"
    command = (f'echo "line one"; while [ ! -f {go} ]; do sleep 0.1; done; echo "line two"; '
               f'while [ ! -f {end} ]; do sleep 0.1; done; echo "done"')
    mine = await site.submit(site.alice, "ui-mine", command)
    theirs = await site.submit(site.bob, "ui-theirs", "sleep 30")
    await eventually(lambda: site.svc.get_job(mine.id), lambda j: j.state is JobState.running, "alice's job runs")
    shots = os.environ.get("LOCKSTEP_UI_SHOTS")

    # Log in with the keyboard alone: the label names the field, Enter submits.
    await _in(browser.get, f"{site.url}/ui/")
    assert "/ui/login" in browser.current_url  # no session: the login page
    field = browser.find_element(By.ID, "token")
    assert browser.find_element(By.CSS_SELECTOR, "label[for=token]").text == "API token"
    await _in(field.send_keys, site.alice + Keys.ENTER)
    await _in(_wait, browser, lambda d: d.find_elements(By.CSS_SELECTOR, f"tr[data-job='{mine.id}']"))
    row = browser.find_element(By.CSS_SELECTOR, f"tr[data-job='{mine.id}']")
    assert "running" in row.find_element(By.CSS_SELECTOR, "td.state").text
    assert theirs.id not in browser.page_source  # another tenant's job is not shown
    cookie = browser.get_cookie("lockstep_session")
    assert cookie is not None and cookie["httpOnly"] and cookie["sameSite"] == "Strict"
    if shots:
        await _in(browser.get_screenshot_as_file, str(Path(shots) / "jobs.png"))

    # The job's page follows its log: the first line, then a line printed only after the page has shown it.
    await _in(row.find_element(By.CSS_SELECTOR, "a").click)
    log = await _in(_wait, browser, lambda d: d.find_element(By.ID, "log"))
    await _in(_wait, browser, lambda d: "line one" in log.text)
    assert "line two" not in log.text
    go.write_text("go")
    await _in(_wait, browser, lambda d: "line two" in log.text)  # arrived live, no reload
    assert browser.find_element(By.ID, "log-status").text == "following"
    if shots:
        await _in(browser.get_screenshot_as_file, str(Path(shots) / "job.png"))

    # Another tenant's job page is a 404 for alice, not its page.
    await _in(browser.get, f"{site.url}/ui/jobs/{theirs.id}")
    assert "ui-theirs" not in browser.page_source

    # Once the job has ended and its cost is booked, the spend page shows alpha's month-to-date figure.
    end.write_text("end")
    await eventually(lambda: site.svc.get_job(mine.id), lambda j: j.state in TERMINAL_STATES, "the job ends")
    await eventually(lambda: site.svc.job_allocations(mine.id),
                     lambda allocs: all(a.cost_usd is not None for a in allocs), "its cost is booked")
    spent = (await site.svc.get_tenant("alpha")).month_to_date_usd
    assert spent > 0
    await _in(browser.get, f"{site.url}/ui/tenants")
    rows = browser.find_elements(By.CSS_SELECTOR, "tr[data-tenant]")
    assert [r.get_attribute("data-tenant") for r in rows] == ["alpha"]  # only its own tenant
    shown = float(rows[0].find_element(By.CSS_SELECTOR, "td.spend").text.replace(",", ""))
    assert shown > 0 and abs(shown - spent) < 0.00006, (shown, spent)  # four decimals under a dollar
    assert rows[0].find_element(By.TAG_NAME, "meter").get_attribute("aria-label")
    if shots:
        await _in(browser.get_screenshot_as_file, str(Path(shots) / "tenants.png"))
