"""The web view behind two replicas sharing a store, in a real headless Chromium: each replica
lists every replica's sessions (the same list on every load, whichever replica answers), a
replay id pasted into the box opens its decision, and a link ``/ui#rp-...`` opens it, through
the sign-in."""

from __future__ import annotations

import re
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from openai import OpenAI

from extproc.dev.harness import Stack, run_stack
from tests.e2e.conftest import ADMIN_TOKEN, e2e_config, get_json
from tests.e2e.test_observe import _chromium

pytestmark = pytest.mark.e2e
SESSIONS = [f"web-{i}" for i in range(6)]


@pytest.fixture(scope="module")
def replicated(tmp_path_factory) -> Iterator[tuple[Stack, dict[str, str]]]:
    with run_stack(e2e_config(), replicas=2, store="valkey",
                   workdir=tmp_path_factory.mktemp("web")) as stack:
        ids = {}
        for session in SESSIONS:
            client = OpenAI(base_url=f"{stack.url}/v1", api_key="key-web", max_retries=0,
                            default_headers={"x-session-id": session})
            raw = client.chat.completions.with_raw_response.create(
                model="auto", messages=[{"role": "user", "content": f"explain {session}"}])
            ids[session] = raw.headers["x-replay-id"]
        yield stack, ids


def _routed(stack: Stack, replica: int) -> float:
    text = urllib.request.urlopen(
        f"http://127.0.0.1:{stack.processors[replica].http_port}/metrics", timeout=5).read()
    return sum(float(v) for v in re.findall(rb"^saar_requests_total\{[^}]*\} (\S+)$", text,
                                            re.MULTILINE))


def _listed(stack: Stack, replica: int) -> list[str]:
    port = stack.processors[replica].http_port
    for _ in range(100):
        found = get_json(f"http://127.0.0.1:{port}/v1/sessions?limit=100")["sessions"]
        names = sorted(s["session_id"] for s in found)
        if set(SESSIONS) <= set(names):
            return names
        time.sleep(0.05)
    raise AssertionError(f"replica {replica} lists {names}")


def test_every_replica_lists_every_replicas_sessions(replicated) -> None:
    stack, _ = replicated
    assert _routed(stack, 0) > 0 and _routed(stack, 1) > 0, "both replicas routed some"
    first, second = _listed(stack, 0), _listed(stack, 1)
    assert first == second == sorted(SESSIONS)
    assert _listed(stack, 0) == first                       # the same on every load


def _sign_in(driver: Any, url: str) -> None:
    from selenium.webdriver.common.by import By

    driver.get(url)
    driver.find_element(By.ID, "token").send_keys(ADMIN_TOKEN)
    driver.find_element(By.ID, "sign-in").click()


def test_the_web_view_opens_a_replay_id_by_box_and_by_link(replicated, tmp_path) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    stack, ids = replicated
    _listed(stack, 0)
    driver = _chromium(tmp_path / "chromium-profile")
    wait = WebDriverWait(driver, 30)

    def decided(replay_id: str) -> str:
        return str(wait.until(lambda d: (
            d.find_element(By.ID, "decision-title").text.endswith(replay_id)
            and d.find_element(By.ID, "decision-body").text) or None))

    try:
        # A link to a decision, opened before signing in: it survives the sign-in.
        link = ids["web-2"]
        _sign_in(driver, f"http://127.0.0.1:{stack.processors[1].http_port}/ui#{link}")
        told = decided(link)
        assert "Base selection" in told
        assert driver.current_url.endswith(f"/ui#{link}")
        selected = wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "rect.slice.selected"))
        assert [s.get_attribute("data-replay") for s in selected] == [link]
        rows = wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#sessions tbody tr")
                          if len(d.find_elements(By.CSS_SELECTOR, "#sessions tbody tr"))
                          >= len(SESSIONS) else None)
        assert sorted(r.get_attribute("data-session") for r in rows) == sorted(SESSIONS)
        # The box: paste another session's id (whichever replica routed it).
        other = ids["web-5"]
        box = driver.find_element(By.ID, "replay-id")
        box.clear()
        box.send_keys(other)
        driver.find_element(By.ID, "open-replay").click()
        decided(other)
        assert driver.current_url.endswith(f"#{other}")
        title = driver.find_element(By.ID, "timeline-title").text
        assert title.endswith("web-5")
        # An id that is nobody's says so, and the page stays usable.
        box.clear()
        box.send_keys("rp-not-a-record")
        driver.find_element(By.ID, "open-replay").click()
        wait.until(lambda d: "No record rp-not-a-record" in
                   d.find_element(By.ID, "decision-empty").text)
        # The same list on the other replica (the cookie is good there too: it is signed
        # with the admin token, not kept by a replica).
        driver.get(f"http://127.0.0.1:{stack.processors[0].http_port}/ui")
        rows = wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#sessions tbody tr")
                          if len(d.find_elements(By.CSS_SELECTOR, "#sessions tbody tr"))
                          >= len(SESSIONS) else None)
        assert sorted(r.get_attribute("data-session") for r in rows) == sorted(SESSIONS)
    finally:
        driver.quit()
