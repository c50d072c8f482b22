"""The web UI in a real headless browser (Debian's chromium + chromedriver, through Selenium):
log in, see a queue appear after a publish, see the overview's, a queue's and an exchange's
charts drawn from traffic, purge the queue, explain a route; set and clear topic permissions.

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

# slow (a headless browser): `make check` leaves it out
pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]

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


def log_in(driver, url, wrong_first=False):
    from selenium.webdriver.common.by import By

    driver.get(url + "/")
    form = wait_for(lambda: driver.find_element(By.ID, "login"))
    if wrong_first:
        fill(form, user="guest", password="wrong")
        form.find_element(By.TAG_NAME, "button").click()
        wait_for(lambda: "Login failed" in text_of(driver, "#login-error"))
    fill(form, user="guest", password="guest")
    form.find_element(By.TAG_NAME, "button").click()
    wait_for(lambda: "Overview" in text_of(driver, "#view h2"))
    assert "guest" in text_of(driver, "#who")


def fill(form, **fields):
    from selenium.webdriver.common.by import By

    for name, value in fields.items():
        field = form.find_element(By.NAME, name)
        field.clear()
        field.send_keys(value)


def traffic(b, driver, ch, rounds=3):
    """Rounds of publishes to ui-shop (one unroutable) and of gets from ui-orders (one
    redelivered, one left unacked until the next round); after each, the broker samples its
    rates (by hand: the test stopped its timer) and the page shown is drawn again, so that
    each of its charts gains a point."""
    sampler = b.broker._management.rates
    pause = 1.0 if os.environ.get("ROARMQ_UI_SCREENSHOTS") else 0.2  # docs: a few seconds' worth
    b.call(sampler.sample)
    unacked = None
    for i in range(rounds):
        for _ in range(4 + 2 * i):
            ch.basic_publish("ui-shop", "order.new", b"order")
        ch.basic_publish("ui-shop", "nowhere", b"lost")  # in, not out
        if unacked is not None:
            ch.basic_ack(unacked)
        tag = ch.basic_get("ui-orders")[0].delivery_tag
        ch.basic_nack(tag, requeue=True)
        for _ in range(2):
            ch.basic_ack(ch.basic_get("ui-orders")[0].delivery_tag)
        unacked = ch.basic_get("ui-orders")[0].delivery_tag
        time.sleep(pause)
        b.call(sampler.sample)
        driver.execute_async_script("route().then(arguments[arguments.length - 1])")


def legend(driver, chart):
    """{series label: the figure its legend shows} of a chart card."""
    from selenium.webdriver.common.by import By

    return {
        e.get_attribute("data-series"): float(e.find_element(By.TAG_NAME, "b").text)
        for e in driver.find_elements(By.CSS_SELECTOR, chart + " [data-series]")
    }


def painted(driver, chart):
    """{series label: how many of the chart's canvas pixels are in the series' colour}."""
    return driver.execute_script(
        r"""
        const card = document.querySelector(arguments[0]), canvas = card.querySelector("canvas");
        const px = canvas.getContext("2d").getImageData(0, 0, canvas.width, canvas.height).data;
        const counts = {};
        for (const s of card.querySelectorAll("[data-series]")) {
          const swatch = getComputedStyle(s.querySelector(".swatch")).backgroundColor;
          const [r, g, b] = swatch.match(/\d+/g).map(Number);
          let n = 0;
          for (let i = 0; i < px.length; i += 4) n += px[i] === r && px[i + 1] === g && px[i + 2] === b;
          counts[s.dataset.series] = n;
        }
        return counts;
        """,
        chart,
    )


def assert_charted(driver, chart, labels):
    """The chart shows these series, each above zero in its legend and drawn on its canvas."""
    figures, pixels = legend(driver, chart), painted(driver, chart)
    assert sorted(figures) == sorted(labels) == sorted(pixels)
    assert all(figures[label] > 0 for label in labels), figures
    assert all(pixels[label] > 20 for label in labels), pixels


def test_log_in_see_charts_purge_a_queue_and_explain_a_route(browser, tmp_path):
    from selenium.webdriver.common.by import By

    with BrokerThread(ephemeral_config(data_dir=str(tmp_path / "d")), management=True) as b:
        b.call(b.broker._management.rates.stop)  # sampled by hand in traffic()
        conn = pika.BlockingConnection(pika.URLParameters(b.url))
        ch = conn.channel()
        ch.exchange_declare("ui-shop", "topic")
        ch.queue_declare("ui-orders")
        ch.queue_bind("ui-orders", "ui-shop", "order.*")

        log_in(browser, b.mgmt_url, wrong_first=True)

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
        traffic(b, browser, ch)
        assert_charted(browser, "#chart-rates", ["publish", "deliver/get", "ack"])
        assert_charted(browser, "#chart-messages", ["ready", "unacked", "total"])
        shot(browser, "overview")
        node = text_of(browser, "#view .card")
        # each listener once, with its addresses; no alarm, the message store healthy
        assert f"amqp {b.port} (127.0.0.1)" in node and node.count(f"amqp {b.port}") == 1
        assert "alarms: none" in node

        browser.get(b.mgmt_url + "/#/queue/%2F/ui-orders")
        ready = str(ch.queue_declare("ui-orders", passive=True).method.message_count)
        wait_for(lambda: text_of(browser, '[data-total="Ready"] b') == ready)
        traffic(b, browser, ch)
        assert_charted(browser, "#chart-rates", ["publish", "deliver/get", "ack", "redelivered"])
        assert_charted(browser, "#chart-messages", ["ready", "unacked", "total"])
        shot(browser, "queue")
        browser.find_element(By.ID, "purge").click()
        wait_for(lambda: text_of(browser, '[data-total="Ready"] b') == "0")
        assert ch.queue_declare("ui-orders", passive=True).method.message_count == 0

        browser.get(b.mgmt_url + "/#/exchange/%2F/ui-shop")
        wait_for(lambda: browser.find_element(By.ID, "chart-rates"))
        traffic(b, browser, ch, rounds=2)
        assert_charted(browser, "#chart-rates", ["publish in", "publish out"])
        rates = legend(browser, "#chart-rates")
        assert rates["publish in"] > rates["publish out"]  # one a round was unroutable
        explain = browser.find_element(By.ID, "explain")
        explain.find_element(By.NAME, "key").send_keys("order.paid")
        explain.find_element(By.TAG_NAME, "button").click()
        wait_for(lambda: "ui-orders" in text_of(browser, "#explained"))
        assert "order.*" in text_of(browser, "#explained table")

        browser.get(b.mgmt_url + "/#/bindings")
        wait_for(lambda: "order.*" in text_of(browser, "#view table"))
        conn.close()


def test_set_and_clear_topic_permissions(browser, tmp_path):
    from selenium.webdriver.common.by import By

    card = "#set-topic-permissions"
    with BrokerThread(ephemeral_config(data_dir=str(tmp_path / "d")), management=True) as b:
        log_in(browser, b.mgmt_url)
        browser.get(b.mgmt_url + "/#/users")
        for exchange, write in (("amq.topic", r"^orders\."), ("ui-events", r"^{username}\.")):
            form = wait_for(lambda: browser.find_element(By.CSS_SELECTOR, card))
            fill(form, user="guest", exchange=exchange, write=write, read="^audit$")
            form.find_element(By.CSS_SELECTOR, "button:not([type])").click()
            wait_for(lambda e=exchange: e in text_of(browser, card + " table"))
        assert sorted(b.api("GET", "/api/topic-permissions")[1], key=lambda t: t["exchange"]) == [
            {"user": "guest", "vhost": "/", "exchange": "amq.topic", "write": r"^orders\.", "read": "^audit$"},
            {"user": "guest", "vhost": "/", "exchange": "ui-events", "write": r"^{username}\.", "read": "^audit$"},
        ]  # fmt: skip

        form = browser.find_element(By.CSS_SELECTOR, card)
        fill(form, user="nobody")
        form.find_element(By.CSS_SELECTOR, "button:not([type])").click()
        wait_for(lambda: "not_found" in text_of(browser, card + " .error"))

        row = next(
            r
            for r in browser.find_elements(By.CSS_SELECTOR, card + " tbody tr")
            if "amq.topic" in r.text
        )
        row.find_element(By.CSS_SELECTOR, "[data-clear]").click()
        wait_for(lambda: "amq.topic" not in text_of(browser, card + " table"))
        assert [t["exchange"] for t in b.api("GET", "/api/topic-permissions")[1]] == ["ui-events"]

        form = browser.find_element(By.CSS_SELECTOR, card)
        fill(form, user="guest")
        form.find_element(By.CSS_SELECTOR, "[data-clear-all]").click()
        wait_for(lambda: "(none)" in text_of(browser, card + " table"))
        assert b.api("GET", "/api/topic-permissions")[1] == []
        assert "guest" in text_of(browser, "#set-permissions table")  # the vhost permission stays
