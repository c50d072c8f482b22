"""The web UI in a real headless browser (Debian's chromium + chromedriver, through Selenium):
log in, see a queue appear after a publish, purge it, explain a route.

ROARMQ_UI_SCREENSHOTS=DIR saves the overview and a queue page there (docs/ui-*.png were
made so: `ROARMQ_UI_SCREENSHOTS=docs .venv/bin/python -m pytest tests/ui`).
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pika
import pytest

from roarmq.broker.testing import BrokerThread, ephemeral_config

pytestmark = pytest.mark.timeout(120)

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")


@pytest.fixture
def browser():
    from selenium import webdriver  # a dev dependency: missing, it fails, never skips

    if CHROMIUM is None or DRIVER is None:
        pytest.skip("chromium and chromedriver not installed (`make test` installs them with apt)")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--window-size=1280,900",
        "--disable-dev-shm-usage",
    ):
        options.add_argument(arg)
    driver = webdriver.Chrome(
        service=webdriver.ChromeService(executable_path=DRIVER), options=options
    )
    driver.implicitly_wait(0)
    yield driver
    driver.quit()


def wait_for(predicate, timeout=10.0):
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = predicate()
        except Exception:  # noqa: BLE001 - the element is not there yet
            value = None
        if value:
            return value
        assert time.monotonic() < deadline, "timed out waiting in the browser"
        time.sleep(0.1)


def text_of(driver, css):
    from selenium.webdriver.common.by import By

    return " ".join(e.text for e in driver.find_elements(By.CSS_SELECTOR, css))


def shot(driver, name):
    where = os.environ.get("ROARMQ_UI_SCREENSHOTS")
    if where:
        Path(where).mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(Path(where) / f"ui-{name}.png"))


def test_log_in_see_a_queue_purge_it_and_explain_a_route(browser, tmp_path):
    from selenium.webdriver.common.by import By

    with BrokerThread(ephemeral_config(data_dir=str(tmp_path / "d")), management=True) as b:
        conn = pika.BlockingConnection(pika.URLParameters(b.url))
        ch = conn.channel()
        ch.exchange_declare("ui-shop", "topic")
        ch.queue_declare("ui-orders")
        ch.queue_bind("ui-orders", "ui-shop", "order.*")

        browser.get(b.mgmt_url + "/")
        form = wait_for(lambda: browser.find_element(By.ID, "login"))
        form.find_element(By.NAME, "user").send_keys("guest")
        form.find_element(By.NAME, "password").send_keys("wrong")
        form.find_element(By.TAG_NAME, "button").click()
        wait_for(lambda: "Login failed" in text_of(browser, "#login-error"))
        pw = form.find_element(By.NAME, "password")
        pw.clear()
        pw.send_keys("guest")
        form.find_element(By.TAG_NAME, "button").click()
        wait_for(lambda: "Overview" in text_of(browser, "#view h2"))
        assert "guest" in text_of(browser, "#who")

        for i in range(3):
            ch.basic_publish("ui-shop", "order.new", b"order %d" % i)
        browser.get(b.mgmt_url + "/#/queues")
        wait_for(lambda: "ui-orders" in text_of(browser, "#view table"))
        row = next(
            r
            for r in browser.find_elements(By.CSS_SELECTOR, "#view tbody tr")
            if "ui-orders" in r.text
        )
        assert row.find_elements(By.TAG_NAME, "td")[3].text == "3"  # ready

        browser.get(b.mgmt_url + "/#/")
        wait_for(lambda: "3" in text_of(browser, '[data-total="Ready"] b'))
        shot(browser, "overview")

        browser.get(b.mgmt_url + "/#/queue/%2F/ui-orders")
        wait_for(lambda: text_of(browser, '[data-total="Ready"] b') == "3")
        shot(browser, "queue")
        browser.find_element(By.ID, "purge").click()
        wait_for(lambda: text_of(browser, '[data-total="Ready"] b') == "0")
        assert ch.queue_declare("ui-orders", passive=True).method.message_count == 0

        browser.get(b.mgmt_url + "/#/exchange/%2F/ui-shop")
        explain = wait_for(lambda: browser.find_element(By.ID, "explain"))
        explain.find_element(By.NAME, "key").send_keys("order.paid")
        explain.find_element(By.TAG_NAME, "button").click()
        wait_for(lambda: "ui-orders" in text_of(browser, "#explained"))
        assert "order.*" in text_of(browser, "#explained table")

        browser.get(b.mgmt_url + "/#/bindings")
        wait_for(lambda: "order.*" in text_of(browser, "#view table"))
        conn.close()
