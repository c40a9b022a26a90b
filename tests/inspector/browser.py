"""A real headless Chromium (Debian's chromium and chromium-driver) driven by selenium: a
fresh profile each time, nothing fetched but what the page asks for."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator

from selenium import webdriver
from selenium.webdriver.chrome.service import Service

DRIVER = "/usr/bin/chromedriver"
_ARGS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--window-size=1280,900")


@contextlib.contextmanager
def chrome(javascript: bool = True) -> Iterator[webdriver.Chrome]:
    # selenium looks for drivers online unless told it is offline
    os.environ["SE_OFFLINE"] = "true"
    with tempfile.TemporaryDirectory(prefix="tailfloor-chrome-") as profile:
        options = webdriver.ChromeOptions()
        for arg in _ARGS:
            options.add_argument(arg)
        options.add_argument(f"--user-data-dir={profile}")
        if not javascript:
            options.add_experimental_option(
                "prefs", {"profile.managed_default_content_settings.javascript": 2})
        driver = webdriver.Chrome(service=Service(DRIVER), options=options)
        try:
            driver.set_page_load_timeout(60)
            yield driver
        finally:
            driver.quit()
