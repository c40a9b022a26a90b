"""The inspector's pages in a real headless Chromium: hostile content stays text, folding
and the filter work by clicking and typing, with JavaScript on and off, at laptop and phone
widths."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import orjson
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from proxy.report import RequestReport
from tests.evidence import artifacts_root
from tests.fake_behaviour import AgentBehaviour
from tests.fake_upstream import FakeUpstream, Reply
from tests.floor.test_floor_e2e import setup as floor_setup
from tests.inprocess import InProcessProxy, inproc  # noqa: F401  (a fixture)
from tests.inspector.browser import chrome
from tests.inspector.client import chat, session_url
from tests.inspector.test_broken_answers import last_event

Make = Callable[..., InProcessProxy]
PWN = "window.__pwned=1"
HOSTILE = [
    f"<script>{PWN}</script>",
    f'<img src=x onerror="{PWN}">',
    "</textarea><textarea>",
    f'<a href="javascript:{PWN}">click me</a> javascript:{PWN}',
    f"</pre></li></ol></details><script>{PWN}</script>",
    '"><svg onload="window.__pwned=1">',
]
BIG = "A" * (1024 * 1024)


def wide_proxy(inproc: Make, tmp_path: Path) -> InProcessProxy:  # noqa: F811
    """A proxy whose model has room for the 1 MB message (no compaction in the way)."""
    rules = tmp_path / "rules"
    rules.mkdir(exist_ok=True)
    (rules / "wide.toml").write_text('[[models]]\npattern = "fake*"\ncontext_window = 4000000\n'
                                     'encoding = "estimate"\n')
    return inproc("--inspect-content", "--rules", str(rules))


def hostile_session(proxy: InProcessProxy) -> None:
    messages = [{"role": "system", "content": "system prompt"}]
    for n, text in enumerate(HOSTILE):
        messages += [{"role": "user", "content": text}, {"role": "assistant", "content": f"ok {n}"}]
    messages.append({"role": "user", "content": BIG})
    chat(proxy, messages[:5], session="s-hostile")
    chat(proxy, messages, session="s-hostile")
    chat(proxy, [{"role": "user", "content": "another session"}], session="s-other")


def keep_surrogates(proxy: InProcessProxy) -> None:
    """A report whose text holds lone surrogates (the proxy's JSON parser refuses them; a
    report must render whatever it holds)."""
    text = "lone \ud800 high and \udfff low"
    report = RequestReport(
        request_id="surrogates-1", at=time.time(), route="chat_completions", model="m\ud800",
        stream=False, status=200, verdict="none \udfff", seconds=0.1,
        proxy_seconds=0.0, session_id="s-surrogate", agent="a\udfff",
        messages=({"role": "user", "content": text},))
    store = proxy.state.inspector
    assert store is not None

    async def keep() -> None:
        store.keep(report)

    asyncio.run_coroutine_threadsafe(keep(), proxy.loop).result(5)


def pwned(driver: WebDriver) -> str:
    found: str = driver.execute_script("return typeof window.__pwned")
    return found


def test_hostile_content_renders_as_text(inproc: Make, tmp_path: Path) -> None:  # noqa: F811
    proxy = wide_proxy(inproc, tmp_path)
    hostile_session(proxy)
    keep_surrogates(proxy)
    with chrome() as driver:
        driver.get(session_url(proxy, "s-hostile"))
        assert driver.find_element(By.TAG_NAME, "h1").text.startswith("Session")
        newest = driver.find_element(By.CSS_SELECTOR, "details.request[open]")
        shown = [e.get_attribute("textContent") or ""
                 for e in newest.find_elements(By.CSS_SELECTOR, "li.message pre.text")]
        for text in HOSTILE:
            assert text in shown, text
        assert pwned(driver) == "undefined"
        scripts = driver.find_elements(By.TAG_NAME, "script")
        assert [s.get_attribute("src") for s in scripts] == [
            proxy.admin_url + "/tailfloor/ui/static/inspector.js"]
        assert driver.find_elements(By.TAG_NAME, "img") == []
        assert driver.find_elements(By.TAG_NAME, "textarea") == []
        assert driver.find_elements(By.CSS_SELECTOR, "a[href^='javascript']") == []
        assert driver.find_elements(By.CSS_SELECTOR, "main svg [onload]") == []
        # every message of the request is an element of its own, with its marks
        marks = newest.find_elements(By.CSS_SELECTOR, "li.message")
        assert len(marks) == 2 * len(HOSTILE) + 2
        assert {m.get_attribute("data-provenance") for m in marks} == {"agent"}
        driver.save_screenshot(str(artifacts() / "hostile.png"))

        # the request before sent the first five: folded as a run, still in the page
        run = newest.find_element(By.CSS_SELECTOR, "details.unchanged")
        assert run.find_element(By.TAG_NAME, "summary").text.startswith("5 unchanged")
        assert len(run.find_elements(By.CSS_SELECTOR, "li.message[data-role]")) == 5
        assert not run.find_element(By.CSS_SELECTOR, "li.message").is_displayed()
        run.find_element(By.TAG_NAME, "summary").click()
        assert run.find_element(By.CSS_SELECTOR, "li.message").is_displayed()

        # 1 MB of one character: folded behind a preview, unfolded by a click
        long = newest.find_element(By.CSS_SELECTOR, "details.long")
        full = long.find_element(By.CSS_SELECTOR, "pre.text")
        assert not full.is_displayed()
        long.find_element(By.TAG_NAME, "summary").click()
        assert full.is_displayed()
        assert len(full.get_attribute("textContent") or "") == len(BIG)

        # the script's control folds and unfolds them all
        button = newest.find_element(By.CSS_SELECTOR, "button.unfold-all")
        assert button.is_displayed() and button.text == "unfold all"
        button.click()
        assert not full.is_displayed() and button.text == "unfold all"
        button.click()
        assert full.is_displayed() and button.text == "fold all"

        driver.get(session_url(proxy, "s-surrogate"))
        main = driver.find_element(By.TAG_NAME, "main").text
        assert "lone ? high and ? low" in main and "none ?" in main
        driver.get(proxy.admin_url + "/tailfloor/ui")
        assert "a?" in driver.find_element(By.CSS_SELECTOR, "tr[data-session=s-surrogate]").text
        assert pwned(driver) == "undefined"


def test_the_filter_and_folding_with_and_without_javascript(inproc: Make,  # noqa: F811
                                                            tmp_path: Path) -> None:
    proxy = wide_proxy(inproc, tmp_path)
    hostile_session(proxy)
    with chrome() as driver:
        driver.get(proxy.admin_url + "/tailfloor/ui")
        rows = driver.find_elements(By.CSS_SELECTOR, "tr[data-session]")
        assert [r.get_attribute("data-session") for r in rows] == ["s-other", "s-hostile"]
        driver.find_element(By.ID, "filter").send_keys("hostile")
        assert [r.is_displayed() for r in rows] == [False, True]
        rows[1].find_element(By.TAG_NAME, "a").click()
        assert driver.current_url == session_url(proxy, "s-hostile")
    with chrome(javascript=False) as driver:
        driver.get(session_url(proxy, "s-hostile"))
        newest = driver.find_element(By.CSS_SELECTOR, "details.request[open]")
        assert not newest.find_element(By.CSS_SELECTOR, "button.unfold-all").is_displayed()
        long = newest.find_element(By.CSS_SELECTOR, "details.long")
        full = long.find_element(By.CSS_SELECTOR, "pre.text")
        assert not full.is_displayed()
        long.find_element(By.TAG_NAME, "summary").click()
        assert full.is_displayed()
        older = driver.find_elements(By.CSS_SELECTOR, "details.request:not([open])")
        assert len(older) == 1
        older[0].find_element(By.TAG_NAME, "summary").click()
        assert older[0].find_element(By.CSS_SELECTOR, "li.message").is_displayed()


def test_the_page_fits_a_phone_and_a_laptop(inproc: Make, tmp_path: Path  # noqa: F811
                                            ) -> None:
    proxy = wide_proxy(inproc, tmp_path)
    hostile_session(proxy)
    with chrome() as driver:
        for width, height in ((390, 844), (1366, 768)):
            driver.set_window_size(width, height)
            for url in (proxy.admin_url + "/tailfloor/ui", session_url(proxy, "s-hostile")):
                driver.get(url)
                overflow = driver.execute_script(
                    "return document.documentElement.scrollWidth"
                    " - document.documentElement.clientWidth")
                assert overflow <= 1, (width, url, overflow)


def artifacts() -> Path:
    """Where screenshots go: the artifacts CI keeps (``tests.evidence``)."""
    where = artifacts_root() / "inspector"
    where.mkdir(parents=True, exist_ok=True)
    return where


def test_a_floor_s_restored_messages_in_the_browser(fake: FakeUpstream,
                                                   tmp_path: Path) -> None:
    fake.reset()
    fake.behaviour = AgentBehaviour()
    sessions, rules, body = floor_setup(tmp_path, "enforce")
    proxy = InProcessProxy(fake, "--sessions", str(sessions), "--rules", str(rules),
                           "--inspect-content")
    try:
        verdict = chat(proxy, body["messages"])
        restored = int(verdict.split("restored=", 1)[1].split(";")[0].split()[0])
        sent = orjson.loads(fake.chat_requests()[-1].body)["messages"]
        store = proxy.state.inspector
        assert store is not None
        (record,) = store.sessions()
        with chrome() as driver:
            driver.get(session_url(proxy, record.session_id))
            newest = driver.find_element(By.CSS_SELECTOR, "details.request[open]")
            marks = newest.find_elements(By.CSS_SELECTOR, "li.message")
            assert len(marks) == len(sent)
            kinds = [m.get_attribute("data-provenance") for m in marks]
            assert kinds.count("restored") == restored > 0
            assert [m.get_attribute("data-role") for m in marks] == [m["role"] for m in sent]
            first = kinds.index("restored")
            assert kinds[first:first + restored] == ["restored"] * restored
            assert newest.find_elements(By.CSS_SELECTOR, "svg rect.p-restored")
            driver.set_window_size(1280, 1400)
            driver.save_screenshot(str(artifacts() / "inspector-floor.png"))
    finally:
        fake.behaviour = None
        proxy.stop()


def test_a_stream_that_broke_off_reads_as_broken_in_the_browser(
        clean_fake: FakeUpstream) -> None:
    proxy = InProcessProxy(clean_fake)
    try:
        clean_fake.script.append(Reply(close_after_chunks=2))
        assert b"upstream_mid_stream" in last_event(proxy, "s-broken")
        with chrome() as driver:
            driver.get(session_url(proxy, "s-broken"))
            newest = driver.find_element(By.CSS_SELECTOR, "details.request[open]")
            facts = dict(zip([t.text for t in newest.find_elements(By.TAG_NAME, "dt")],
                             [d.text for d in newest.find_elements(By.TAG_NAME, "dd")],
                             strict=True))
            assert facts["answer broke off"].startswith("the upstream broke off its stream")
            mark = newest.find_element(By.CSS_SELECTOR, "summary .broke")
            assert mark.is_displayed() and mark.text == "answer broke off"
            cells = newest.find_elements(By.CSS_SELECTOR, "table.attempts td")
            assert "mid_stream" in [c.text for c in cells]
            driver.save_screenshot(str(artifacts() / "inspector-broken-stream.png"))
    finally:
        proxy.stop()
