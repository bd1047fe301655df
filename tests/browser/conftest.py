"""One stack (sandbox + Airflow) and one Chromium for the browser tests of a module."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.browser.stack import CHROMIUM, CHROMIUM_ARGS, Stack, login, start_stack


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    with start_stack() as running:
        yield running


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    # `make install` puts Debian's chromium there; Playwright's own browser downloads cannot work on these machines.
    assert CHROMIUM.exists(), f"{CHROMIUM} is missing: run `make install` (apt-get install chromium)"
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser: Any, stack: Stack) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    context.set_default_timeout(60_000)
    login(context, stack.airflow)
    yield context.new_page()
    context.close()
