"""The web console in a real headless browser (Debian's chromium + chromedriver, through
Selenium): log in, see a queue appear after a publish, see the overview's, a queue's and an
exchange's charts drawn from the broker's sample history, purge the queue (confirmed),
explain a route; set and clear topic permissions; and an operator's whole session: add an
exchange and a queue with arguments from their forms, bind them, publish, watch the queues
list refresh by itself (and not while paused), get the message, full charts on a page's
first load, unbind and delete with confirmation.

ROARMQ_UI_SCREENSHOTS=DIR saves screenshots there (docs/screenshots/*.png were made so:
`ROARMQ_UI_SCREENSHOTS=docs/screenshots .venv/bin/python -m pytest tests/ui`).
"""

from __future__ import annotations

import os
import shutil
import time
from functools import partial
from pathlib import Path

import pika
import pytest
from machine import missing
from support.waiting import wait_for

from roarmq.broker.testing import BrokerThread, ephemeral_config

# slow (a headless browser): `make check` leaves it out
pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")


@pytest.fixture
def browser():
    from selenium import webdriver  # a dev dependency: missing, it fails, never skips

    if CHROMIUM is None or DRIVER is None:
        missing(
            "chromium and chromedriver not installed (`make test` installs them with apt)",
            "ROARMQ_EXPECT_PACKAGES",
        )
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


#: A wait in the browser: whatever Selenium raises (the element is not there yet, or went
#: stale) counts as no answer.
in_browser = partial(wait_for, timeout=10.0, step=0.1, what="the browser", ignore=Exception)


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
    form = in_browser(lambda: driver.find_element(By.ID, "login"))
    if wrong_first:
        fill(form, user="guest", password="wrong")
        form.find_element(By.TAG_NAME, "button").click()
        in_browser(lambda: "Login failed" in text_of(driver, "#login-error"))
    fill(form, user="guest", password="guest")
    form.find_element(By.TAG_NAME, "button").click()
    in_browser(lambda: "Overview" in text_of(driver, "#view h2"))
    assert "guest" in text_of(driver, "#who")


def fill(form, **fields):
    from selenium.webdriver.common.by import By

    for name, value in fields.items():
        field = form.find_element(By.NAME, name)
        field.clear()
        field.send_keys(value)


class Samples:
    """The broker's rate sampler, driven by hand (its timer stopped): each sample is noted in
    its history as taken 5 s after the one before, the last one a moment ago, so that a few
    rounds of traffic in a second of real time fill a chart as 5 s samples would."""

    def __init__(self, b, count):
        self.b, self.sampler = b, b.broker._management.rates
        self.at = time.time() - 5 * count

    def __call__(self):
        at, self.at = self.at, self.at + 5
        self.b.call(lambda: self.sampler.sample(at=at))


def traffic(b, driver, ch, rounds=3):
    """Rounds of publishes to ui-shop (one unroutable) and of gets from ui-orders (one
    redelivered, one left unacked until the next round); after each, the broker samples its
    rates (by hand) and the page shown is drawn again from the broker's history."""
    sample = Samples(b, rounds + 1)
    pause = 1.0 if os.environ.get("ROARMQ_UI_SCREENSHOTS") else 0.2  # docs: a few seconds' worth
    sample()
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
        sample()
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


def assert_drawn(driver, chart, labels):
    """These series of the chart are drawn as lines on its canvas (more than a dot)."""
    pixels = in_browser(lambda: painted(driver, chart))
    assert all(pixels[label] > 60 for label in labels), pixels


def click_button(driver, element_id, text):
    """Click button #element_id once it reads `text`: the page's own button, not the one of
    the same id the previous page left until the new one is drawn (the exchange page has a
    #delete too), and again if a redraw replaced it between finding it and clicking it."""
    from selenium.webdriver.common.by import By

    def attempt():
        button = driver.find_element(By.ID, element_id)
        if button.text != text:
            return False
        button.click()  # a stale button raises here, unclicked: in_browser tries again
        return True

    in_browser(attempt)


def accept(driver, question=None, dismiss=False):
    """Answer the confirmation the page asked (it must have asked)."""
    alert = in_browser(lambda: driver.switch_to.alert, timeout=5)
    if question is not None:
        assert question in alert.text, alert.text
    if dismiss:
        alert.dismiss()
    else:
        alert.accept()


def row_of(driver, css, name):
    """{column title: cell text} of the row of a list that names `name` (read in one go: a
    refresh may redraw the list at any moment)."""
    return driver.execute_script(
        r"""
        const box = document.querySelector(arguments[0]);
        if (!box) return null;
        const titles = [...box.querySelectorAll("thead th")].map(th => th.innerText.trim());
        for (const tr of box.querySelectorAll("tbody tr")) {
          const cells = [...tr.querySelectorAll(":scope > td")].map(td => td.innerText.trim());
          if (cells.includes(arguments[1])) return Object.fromEntries(titles.map((t, i) => [t, cells[i]]));
        }
        return null;
        """,
        css,
        name,
    )


def test_log_in_see_charts_purge_a_queue_and_explain_a_route(browser, tmp_path):
    from selenium.webdriver.common.by import By

    with BrokerThread(ephemeral_config(data_dir=str(tmp_path / "d")), management=True) as b:
        b.call(b.broker._management.rates.stop)  # sampled by hand (Samples)
        conn = pika.BlockingConnection(pika.URLParameters(b.url))
        ch = conn.channel()
        ch.exchange_declare("ui-shop", "topic")
        ch.queue_declare("ui-orders")
        ch.queue_bind("ui-orders", "ui-shop", "order.*")

        log_in(browser, b.mgmt_url, wrong_first=True)

        for i in range(3):
            ch.basic_publish("ui-shop", "order.new", b"order %d" % i)
        browser.get(b.mgmt_url + "/#/queues")
        in_browser(lambda: "ui-orders" in text_of(browser, "#view table"))
        assert row_of(browser, "#view", "ui-orders")["Ready"] == "3"

        browser.get(b.mgmt_url + "/#/")
        in_browser(lambda: "3" in text_of(browser, '[data-total="Ready"] b'))
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
        in_browser(lambda: text_of(browser, '[data-total="Ready"] b') == ready)
        traffic(b, browser, ch)
        assert_charted(browser, "#chart-rates", ["publish", "deliver/get", "ack", "redelivered"])
        assert_charted(browser, "#chart-messages", ["ready", "unacked", "total"])
        shot(browser, "queue")
        browser.find_element(By.ID, "purge").click()
        accept(browser, "Purge all messages of queue ui-orders?")
        in_browser(lambda: text_of(browser, '[data-total="Ready"] b') == "0")
        assert ch.queue_declare("ui-orders", passive=True).method.message_count == 0

        browser.get(b.mgmt_url + "/#/exchange/%2F/ui-shop")
        in_browser(lambda: browser.find_element(By.ID, "chart-rates"))
        traffic(b, browser, ch, rounds=2)
        assert_charted(browser, "#chart-rates", ["publish in", "publish out"])
        rates = legend(browser, "#chart-rates")
        assert rates["publish in"] > rates["publish out"]  # one a round was unroutable
        explain = browser.find_element(By.ID, "explain")
        explain.find_element(By.NAME, "key").send_keys("order.paid")
        explain.find_element(By.TAG_NAME, "button").click()
        in_browser(lambda: "ui-orders" in text_of(browser, "#explained"))
        assert "order.*" in text_of(browser, "#explained table")

        browser.get(b.mgmt_url + "/#/bindings")
        in_browser(lambda: "order.*" in text_of(browser, "#view table"))
        conn.close()


def test_set_and_clear_topic_permissions(browser, tmp_path):
    from selenium.webdriver.common.by import By

    card = "#set-topic-permissions"
    with BrokerThread(ephemeral_config(data_dir=str(tmp_path / "d")), management=True) as b:
        log_in(browser, b.mgmt_url)
        browser.get(b.mgmt_url + "/#/users")
        for exchange, write in (("amq.topic", r"^orders\."), ("ui-events", r"^{username}\.")):
            form = in_browser(lambda: browser.find_element(By.CSS_SELECTOR, card))
            fill(form, user="guest", exchange=exchange, write=write, read="^audit$")
            form.find_element(By.CSS_SELECTOR, "button:not([type])").click()
            in_browser(lambda e=exchange: e in text_of(browser, card + " table"))
        assert sorted(b.api("GET", "/api/topic-permissions")[1], key=lambda t: t["exchange"]) == [
            {"user": "guest", "vhost": "/", "exchange": "amq.topic", "write": r"^orders\.", "read": "^audit$"},
            {"user": "guest", "vhost": "/", "exchange": "ui-events", "write": r"^{username}\.", "read": "^audit$"},
        ]  # fmt: skip

        form = browser.find_element(By.CSS_SELECTOR, card)
        fill(form, user="nobody")
        form.find_element(By.CSS_SELECTOR, "button:not([type])").click()
        in_browser(lambda: "not_found" in text_of(browser, card + " .error"))

        row = next(
            r
            for r in browser.find_elements(By.CSS_SELECTOR, card + " tbody tr")
            if "amq.topic" in r.text
        )
        row.find_element(By.CSS_SELECTOR, "[data-clear]").click()
        accept(browser, "Clear this permission?")
        in_browser(lambda: "amq.topic" not in text_of(browser, card + " table"))
        assert [t["exchange"] for t in b.api("GET", "/api/topic-permissions")[1]] == ["ui-events"]

        form = browser.find_element(By.CSS_SELECTOR, card)
        fill(form, user="guest")
        form.find_element(By.CSS_SELECTOR, "[data-clear-all]").click()
        accept(browser)
        in_browser(lambda: "(none)" in text_of(browser, card + " table"))
        assert b.api("GET", "/api/topic-permissions")[1] == []
        assert "guest" in text_of(browser, "#set-permissions table")  # the vhost permission stays


def set_argument(form, key, value):
    """Pick `key` from the form's "Add:" helper and type its value."""
    from selenium.webdriver.common.by import By

    form.find_element(By.CSS_SELECTOR, f'[data-arg="{key}"]').click()
    for row in form.find_elements(By.CSS_SELECTOR, ".arg-row"):
        if row.find_element(By.CSS_SELECTOR, ".arg-key").get_attribute("value") == key:
            row.find_element(By.CSS_SELECTOR, ".arg-value").send_keys(value)
            return
    raise AssertionError(f"no row for {key}")


def choose(form, name, value):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    Select(form.find_element(By.NAME, name)).select_by_value(value)


def test_an_operator_session(browser, tmp_path):
    """Add an exchange and a queue with arguments, bind them, publish, watch the list,
    get the message, charts full on first load, unbind and delete with confirmation."""
    from selenium.webdriver.common.by import By

    with BrokerThread(ephemeral_config(data_dir=str(tmp_path / "d")), management=True) as b:
        b.call(b.broker._management.rates.stop)  # sampled by hand (Samples)
        log_in(browser, b.mgmt_url)

        # An exchange, with an alternate exchange from the form's helper.
        browser.get(b.mgmt_url + "/#/exchanges")
        in_browser(lambda: "amq.topic" in text_of(browser, "#rows table"))
        browser.find_element(By.CSS_SELECTOR, "#add-exchange-card summary").click()
        form = browser.find_element(By.ID, "add-exchange")
        fill(form, name="ops-x")
        choose(form, "type", "topic")
        set_argument(form, "alternate-exchange", "ops-ae")
        form.find_element(By.CSS_SELECTOR, "button:not([type])").click()
        in_browser(lambda: row_of(browser, "#rows", "ops-x"))
        assert row_of(browser, "#rows", "ops-x")["Features"].split() == ["D", "AE"]
        x = b.api("GET", "/api/exchanges/%2F/ops-x")[1]
        assert (x["type"], x["durable"], x["arguments"]) == (
            "topic",
            True,
            {"alternate-exchange": "ops-ae"},
        )

        # A queue with a message TTL and a length limit (numbers, as the helper types them).
        browser.get(b.mgmt_url + "/#/queues")
        in_browser(lambda: browser.find_element(By.CSS_SELECTOR, "#rows table"))
        browser.find_element(By.CSS_SELECTOR, "#add-queue-card summary").click()
        form = browser.find_element(By.ID, "add-queue")
        assert "Delivery limit" not in form.text  # quorum only: hidden for a classic queue
        fill(form, name="ops-q")
        set_argument(form, "x-message-ttl", "60000")
        set_argument(form, "x-max-length", "100")
        browser.execute_script("arguments[0].scrollIntoView()", form)
        shot(browser, "add-queue")
        form.find_element(By.CSS_SELECTOR, "button:not([type])").click()
        in_browser(lambda: row_of(browser, "#rows", "ops-q"))
        assert row_of(browser, "#rows", "ops-q")["Features"].split() == ["D", "TTL", "Lim"]
        q = b.api("GET", "/api/queues/%2F/ops-q")[1]
        assert q["arguments"] == {"x-message-ttl": 60000, "x-max-length": 100}
        shot(browser, "queues")

        # Bind it from the queue's page; its arguments shown as a table, not JSON.
        browser.get(b.mgmt_url + "/#/queue/%2F/ops-q")
        form = in_browser(lambda: browser.find_element(By.ID, "bind"))
        assert "x-message-ttl 60000" in text_of(browser, "#arguments")
        fill(form, source="ops-x", key="ops.#")
        form.find_element(By.CSS_SELECTOR, "button:not([type])").click()
        in_browser(lambda: "ops.#" in text_of(browser, "#bindings table"))
        assert [(r["source"], r["routing_key"]) for r in b.api("GET", "/api/queues/%2F/ops-q/bindings")[1]] == [
            ("", "ops-q"), ("ops-x", "ops.#")
        ]  # fmt: skip

        # Publish from the exchange's page, which lists the binding from its side.
        browser.get(b.mgmt_url + "/#/exchange/%2F/ops-x")
        in_browser(lambda: "ops-q" in text_of(browser, "#bindings table"))
        assert "alternate-exchange ops-ae" in text_of(browser, "#arguments")
        assert "Durable true" in text_of(browser, "#details")
        form = browser.find_element(By.ID, "publish")
        fill(form, key="ops.created", payload="hello ops")
        form.find_element(By.CSS_SELECTOR, "button:not([type])").click()
        in_browser(lambda: "Message published." in text_of(browser, "#publish .ok"))

        # The queues list shows it, and then a client's publish without a reload.
        browser.get(b.mgmt_url + "/#/queues")
        in_browser(lambda: (row_of(browser, "#rows", "ops-q") or {}).get("Ready") == "1")
        conn = pika.BlockingConnection(pika.URLParameters(b.url))
        ch = conn.channel()
        ch.basic_publish("ops-x", "ops.updated", b"second")
        in_browser(lambda: row_of(browser, "#rows", "ops-q")["Ready"] == "2", timeout=12)
        # Paused, it stays as it was; refreshing again, it catches up.
        choose(browser, "refresh", "0")
        assert "paused" in text_of(browser, "#refreshed")
        ch.basic_publish("ops-x", "ops.updated", b"third")
        time.sleep(6)
        assert row_of(browser, "#rows", "ops-q")["Ready"] == "2"
        choose(browser, "refresh", "5")
        in_browser(lambda: row_of(browser, "#rows", "ops-q")["Ready"] == "3", timeout=12)
        # Filtered by a regular expression, on the server.
        filter_box = browser.find_element(By.CSS_SELECTOR, "#rows .filter")
        browser.find_element(By.CSS_SELECTOR, "#rows .regex").click()
        filter_box.send_keys("^ops-[q]$")
        in_browser(lambda: text_of(browser, "#rows .where").split("· ")[1].startswith("1 of "))
        assert [r for r in ("ops-q", "ui-other") if row_of(browser, "#rows", r)] == ["ops-q"]

        # Get the message published from the exchange's page: removed ("Automatic ack").
        browser.get(b.mgmt_url + "/#/queue/%2F/ops-q")
        form = in_browser(lambda: browser.find_element(By.ID, "get"))
        choose(form, "ackmode", "ack_requeue_false")
        form.find_element(By.CSS_SELECTOR, "button:not([type])").click()
        in_browser(lambda: "hello ops" in text_of(browser, "#got"))
        assert "ops.created" in text_of(browser, "#got")
        in_browser(lambda: text_of(browser, '[data-total="Ready"] b') == "2")

        # Traffic, sampled; then the queue's page opens with its charts already drawn.
        browser.get(b.mgmt_url + "/#/")
        sample = Samples(b, 4)
        sample()
        held = None
        for i in range(3):
            for _ in range(3 + i):
                ch.basic_publish("ops-x", "ops.tick", b"tick")
            ch.basic_publish("ops-x", "nowhere", b"lost")  # in, not out (no ops-ae)
            ch.basic_ack(ch.basic_get("ops-q")[0].delivery_tag)
            ch.basic_nack(ch.basic_get("ops-q")[0].delivery_tag, requeue=True)
            if held is not None:
                ch.basic_ack(held)
            held = ch.basic_get("ops-q")[0].delivery_tag  # one unacked at each sample
            sample()
        ch.basic_ack(held)
        browser.get(b.mgmt_url + "/#/queue/%2F/ops-q")
        in_browser(lambda: browser.find_element(By.CSS_SELECTOR, "#chart-rates canvas"))
        assert_drawn(browser, "#chart-messages", ["ready", "unacked", "total"])
        assert_drawn(browser, "#chart-rates", ["publish", "deliver/get", "ack"])
        shot(browser, "queue-first-load")

        # The exchange's page: charts there too at once; unbind, asked first.
        browser.get(b.mgmt_url + "/#/exchange/%2F/ops-x")
        in_browser(lambda: "ops-q" in text_of(browser, "#bindings table"))
        assert_drawn(browser, "#chart-rates", ["publish in", "publish out"])
        shot(browser, "exchange")
        browser.find_element(By.CSS_SELECTOR, "#bindings button.unbind").click()
        accept(browser, "Remove this binding?", dismiss=True)
        assert b.api("GET", "/api/bindings/%2F/e/ops-x/q/ops-q")[1] != []
        browser.find_element(By.CSS_SELECTOR, "#bindings button.unbind").click()
        accept(browser, "Remove this binding?")
        in_browser(lambda: "ops-q" not in text_of(browser, "#bindings"))
        assert b.api("GET", "/api/bindings/%2F/e/ops-x/q/ops-q")[1] == []

        # Delete the queue: cancelled, it stays; confirmed, it goes.
        browser.get(b.mgmt_url + "/#/queue/%2F/ops-q")
        click_button(browser, "delete", "Delete queue")
        accept(browser, "Delete queue ops-q?", dismiss=True)
        assert b.api("GET", "/api/queues/%2F/ops-q")[0] == 200
        click_button(browser, "delete", "Delete queue")
        accept(browser, "Delete queue ops-q?")
        in_browser(lambda: browser.current_url.endswith("#/queues"))
        assert b.api("GET", "/api/queues/%2F/ops-q")[0] == 404

        browser.get(b.mgmt_url + "/#/exchange/%2F/ops-x")
        click_button(browser, "delete", "Delete exchange")
        accept(browser, "Delete exchange ops-x?")
        in_browser(lambda: browser.current_url.endswith("#/exchanges"))
        assert b.api("GET", "/api/exchanges/%2F/ops-x")[0] == 404

        # Closing a connection asks too.
        browser.get(b.mgmt_url + "/#/connections")
        in_browser(lambda: browser.find_element(By.CSS_SELECTOR, "#rows button.close-conn")).click()
        accept(browser, "Close connection")

        def closed():
            if conn.is_open:
                conn.process_data_events(0)  # raises once the broker has closed it
            return not conn.is_open

        in_browser(closed)


def test_limits_page_and_rate_columns_sort(browser, tmp_path):
    """Set a vhost limit and a user limit from the Limits page, see them in the API, clear
    one (cancelled first, then confirmed); the queues list sorts by a rate column."""
    from selenium.webdriver.common.by import By

    with BrokerThread(ephemeral_config(data_dir=str(tmp_path / "d")), management=True) as b:
        log_in(browser, b.mgmt_url)
        browser.get(b.mgmt_url + "/#/limits")
        form = in_browser(lambda: browser.find_element(By.ID, "set-vhost-limit"))
        choose(form, "limit", "max-queues")
        fill(form, value="7")
        form.find_element(By.TAG_NAME, "button").click()
        in_browser(lambda: "max-queues" in text_of(browser, "#vhost-limits table"))
        assert b.api("GET", "/api/vhost-limits")[1] == [{"vhost": "/", "value": {"max-queues": 7}}]
        form = browser.find_element(By.ID, "set-user-limit")
        choose(form, "limit", "max-channels")
        fill(form, user="guest", value="20")
        form.find_element(By.TAG_NAME, "button").click()
        in_browser(lambda: "max-channels" in text_of(browser, "#user-limits table"))
        assert b.api("GET", "/api/user-limits")[1] == [
            {"user": "guest", "value": {"max-channels": 20}}
        ]
        shot(browser, "limits")

        clear = '#vhost-limits [data-limit="max-queues"]'
        browser.find_element(By.CSS_SELECTOR, clear).click()
        accept(browser, "Clear the max-queues limit of virtual host /?", dismiss=True)
        time.sleep(0.3)
        assert b.api("GET", "/api/vhost-limits")[1] != []  # cancelled: it stays
        browser.find_element(By.CSS_SELECTOR, clear).click()
        accept(browser, "Clear the max-queues limit of virtual host /?")
        in_browser(lambda: "max-queues" not in text_of(browser, "#vhost-limits table"))
        assert b.api("GET", "/api/vhost-limits")[1] == []
        assert "max-channels" in text_of(browser, "#user-limits table")  # the other stays

        for name in ("ui-a", "ui-b"):
            b.api("PUT", f"/api/queues/%2F/{name}", {})
        browser.get(b.mgmt_url + "/#/queues")
        head = '#list-queues th[data-sort="message_stats.publish_details.rate"]'
        in_browser(lambda: browser.find_element(By.CSS_SELECTOR, head)).click()
        in_browser(
            lambda: "sorted" in browser.find_element(By.CSS_SELECTOR, head).get_attribute("class")
        )
        assert text_of(browser, "#list-queues .list-error") == ""
        assert "ui-a" in text_of(browser, "#list-queues table")


def test_a_stream_page(browser, tmp_path):
    """A stream's page shows it as RabbitMQ's UI does: retained messages, segments and
    offsets, each consumer's next offset and lag; no get, move or purge (a stream refuses
    them), while a classic queue's page keeps them."""
    from selenium.webdriver.common.by import By

    with BrokerThread(ephemeral_config(data_dir=str(tmp_path / "d")), management=True) as b:
        conn = pika.BlockingConnection(pika.URLParameters(b.url))
        ch = conn.channel()
        ch.queue_declare("ui-events", durable=True, arguments={"x-queue-type": "stream"})
        ch.confirm_delivery()
        for i in range(5):
            ch.basic_publish("", "ui-events", b"event %d" % i)
        reader = conn.channel()
        reader.basic_qos(prefetch_count=3)
        got = []
        reader.basic_consume(
            "ui-events",
            lambda _ch, method, _props, body: got.append(body),
            arguments={"x-stream-offset": "first"},
            consumer_tag="ui-reader",
        )
        deadline = time.monotonic() + 5
        while len(got) < 3 and time.monotonic() < deadline:
            conn.process_data_events(0.1)
        assert got == [b"event 0", b"event 1", b"event 2"]  # prefetch 3, nothing acked

        log_in(browser, b.mgmt_url)
        browser.get(b.mgmt_url + "/#/queue/%2F/ui-events")
        in_browser(lambda: "ui-reader" in text_of(browser, "#live"))
        assert text_of(browser, "#view h2").startswith("Stream ui-events")
        totals = {
            k: text_of(browser, f'[data-total="{k}"] b')
            for k in ("Messages", "First offset", "Last offset", "Consumers")
        }
        assert totals == {
            "Messages": "5",
            "First offset": "0",
            "Last offset": "4",
            "Consumers": "1",
        }
        assert int(text_of(browser, '[data-total="Segments"] b')) >= 1
        row = row_of(browser, "#live", "ui-reader")
        assert (row["Next offset"], row["Offset lag"]) == ("3", "2"), row
        assert "Retained messages" in text_of(browser, "#chart-messages h3")
        for absent in ("get", "move", "purge"):
            assert browser.find_elements(By.ID, absent) == [], absent
        assert browser.find_element(By.ID, "delete").text == "Delete stream"
        shot(browser, "stream")

        ch.queue_declare("ui-plain")
        browser.get(b.mgmt_url + "/#/queue/%2F/ui-plain")
        in_browser(lambda: browser.find_elements(By.ID, "purge"))
        assert text_of(browser, "#view h2").startswith("Queue ui-plain")
        assert browser.find_elements(By.ID, "get") and browser.find_elements(By.ID, "move")
        conn.close()


def test_the_stream_protocol_page(browser, tmp_path):
    """The Streams page lists stream-protocol connections, publishers and consumers (with
    offset and lag), and closes a connection."""
    import asyncio
    import threading

    from rstream import AMQPMessage, Consumer, ConsumerOffsetSpecification, OffsetType, Producer

    with BrokerThread(ephemeral_config(data_dir=str(tmp_path / "d")), management=True) as b:
        ready, done = threading.Event(), threading.Event()

        async def clients() -> None:
            kw = {"port": b.stream_port, "username": "guest", "password": "guest"}
            async with Producer("127.0.0.1", **kw) as producer:
                await producer.create_stream("ui-stream")
                for i in range(4):
                    await producer.send_wait("ui-stream", AMQPMessage(body=b"%d" % i))
                consumer = Consumer("127.0.0.1", **kw)
                await consumer.start()
                seen = []

                async def on_message(message, context) -> None:
                    seen.append(context.offset)

                offset = ConsumerOffsetSpecification(OffsetType.FIRST)
                await consumer.subscribe("ui-stream", on_message, offset_specification=offset)
                while len(seen) < 4:
                    await asyncio.sleep(0.05)
                ready.set()
                while not done.is_set():
                    await asyncio.sleep(0.1)
                await consumer.close()

        thread = threading.Thread(target=asyncio.run, args=(clients(),))
        thread.start()
        try:
            assert ready.wait(20)
            log_in(browser, b.mgmt_url)
            browser.get(b.mgmt_url + "/#/streams")
            in_browser(lambda: "ui-stream" in text_of(browser, "#live"))
            text = text_of(browser, "#live")
            assert "Publishers" in text and "Consumers" in text
            assert text.count("guest") >= 2  # the producer's and the consumer's connections
            shot(browser, "streams")
        finally:
            done.set()
            thread.join(20)


def test_a_delayed_exchange_shows_what_it_holds_and_the_next_due_time(browser, tmp_path):
    with BrokerThread(ephemeral_config(data_dir=str(tmp_path / "d")), management=True) as b:
        conn = pika.BlockingConnection(pika.URLParameters(b.url))
        ch = conn.channel()
        ch.exchange_declare("later", "x-delayed-message", arguments={"x-delayed-type": "direct"})
        for delay in (3_600_000, 7_200_000):
            ch.basic_publish("later", "k", b"m", pika.BasicProperties(headers={"x-delay": delay}))
        due = b.api("GET", "/api/exchanges/%2F/later")[1]["messages_delayed_next_due"]
        conn.close()
        log_in(browser, b.mgmt_url)
        browser.get(b.mgmt_url + "/#/exchanges")
        in_browser(lambda: row_of(browser, "#rows", "later"))
        shown = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(due / 1000))
        assert row_of(browser, "#rows", "later")["Delayed (next due)"] == f"2 ({shown})"
        assert row_of(browser, "#rows", "amq.direct")["Delayed (next due)"] == ""


def test_the_shovels_page_adds_shows_and_deletes_a_shovel(browser, tmp_path):
    """A shovel added from the Shovels page is the parameter RabbitMQ's form would make; its
    row shows it running; Delete (confirmed) removes it."""
    from selenium.webdriver.common.by import By

    with BrokerThread(ephemeral_config(data_dir=str(tmp_path / "d")), management=True) as b:
        b.api("PUT", "/api/queues/%2F/ui-src", {"durable": True})
        log_in(browser, b.mgmt_url)
        browser.get(b.mgmt_url + "/#/shovels")
        form = in_browser(lambda: browser.find_element(By.ID, "add-shovel"))
        fill(form, name="ui-move", src="ui-src", dest="ui-dst", delay="1")
        form.find_element(By.TAG_NAME, "button").click()
        in_browser(lambda: "running" in text_of(browser, "#shovel-rows table"))
        value = b.api("GET", "/api/parameters/shovel/%2F/ui-move")[1]["value"]
        assert value == {
            "src-uri": "amqp://",
            "src-queue": "ui-src",
            "dest-uri": "amqp://",
            "dest-queue": "ui-dst",
            "ack-mode": "on-confirm",
            "src-prefetch-count": 1000,
            "src-delete-after": "never",
            "reconnect-delay": 1,
        }
        assert "queue ui-src" in text_of(browser, "#shovel-rows table")
        shot(browser, "shovels")
        browser.find_element(By.CSS_SELECTOR, '.del-shovel[data-name="ui-move"]').click()
        accept(browser, "Delete shovel ui-move?")
        in_browser(lambda: "ui-move" not in text_of(browser, "#shovel-rows"))
        assert b.api("GET", "/api/shovels")[1] == []


def test_the_federation_page_adds_an_upstream_and_shows_its_link(browser, tmp_path):
    """An upstream added from the Federation page is RabbitMQ's parameter; with a policy,
    the link it makes shows, here with the upstream's login refusal; the URI's password is
    shown nowhere on the page."""
    from selenium.webdriver.common.by import By

    with (
        BrokerThread(ephemeral_config(data_dir=str(tmp_path / "up"))) as up,
        BrokerThread(ephemeral_config(data_dir=str(tmp_path / "d")), management=True) as b,
    ):
        log_in(browser, b.mgmt_url)
        browser.get(b.mgmt_url + "/#/federation")
        form = in_browser(lambda: browser.find_element(By.ID, "add-upstream"))
        fill(form, name="origin", uri=f"amqp://guest:s3cret@127.0.0.1:{up.port}")
        form.find_element(By.TAG_NAME, "button").click()
        in_browser(lambda: "origin" in text_of(browser, "#upstream-rows table"))
        value = b.api("GET", "/api/parameters/federation-upstream/%2F/origin")[1]["value"]
        assert value == {"uri": f"amqp://guest:s3cret@127.0.0.1:{up.port}", "max-hops": 1}
        policy = {"pattern": "^ui", "definition": {"federation-upstream": "origin"}}
        assert b.api("PUT", "/api/policies/%2F/ui", policy)[0] == 201
        b.api("PUT", "/api/exchanges/%2F/ui.x", {"type": "fanout", "durable": True})
        # guest's password is not s3cret there: the link shows the upstream's refusal
        in_browser(lambda: "ACCESS_REFUSED" in text_of(browser, "#link-rows table"))
        assert "ui.x" in text_of(browser, "#link-rows table")
        assert "error" in text_of(browser, "#link-rows table")
        assert "s3cret" not in text_of(browser, "#view")
        shot(browser, "federation")
