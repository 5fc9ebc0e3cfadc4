"""The web UI in a real browser: Debian's headless Chromium, driven by Selenium, against the
session's real ``podium serve`` on the default model (and one more server with keys). A
message streams in; a stopped answer stops on the server; the conversation is found again
after a reload, from the server; hostile model output (script tags, ``onerror``,
``javascript:`` links, a remote image, a 1 MB code block) is shown inert beside typeset math and the page stays responsive; the
page asks for a key, and another key does not see the first one's conversations. The page
must run without a single Content-Security-Policy violation.

``PODIUM_UI_SCREENSHOTS=DIR`` keeps the chat and server views' screenshots there (docs/)."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import httpx
import openai
import pytest

from tests.e2e.conftest import MODEL, podium_serve

CHROMIUM, DRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
if not (shutil.which(CHROMIUM) and shutil.which(DRIVER)):
    pytest.skip(f"no Chromium at {CHROMIUM} and {DRIVER} (Debian: apt-get install chromium "
                f"chromium-driver)", allow_module_level=True)

webdriver = pytest.importorskip("selenium.webdriver")
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

HOSTILE = ("Here you go: $$\\int_0^1 x^2\\,dx = \\tfrac13$$ and\n\n\\[e^{i\\pi} + 1 = 0\\]\n\n<script>window.__pwned = 'script'</script>\n\n"
           "<img src=x onerror=\"window.__pwned = 'img'\">\n\n"
           "[click me](javascript:window.__pwned='link') and "
           "![remote](http://127.0.0.1:9/tracker.png)\n\n"
           "```python\n" + "x = '<img src=y onerror=alert(1)>'\n" * 30_000 + "```\n")


@pytest.fixture
def browser(request):
    """A fresh headless Chromium (its own profile: storage starts empty)."""
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                "--window-size=1200,900"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(DRIVER), options=options)
    yield driver
    # script errors and policy violations (a refused key's 401 is logged too: expected)
    problems = [e["message"] for e in driver.get_log("browser")
                if "Content Security Policy" in e["message"] or (
                    e["level"] == "SEVERE" and "Failed to load resource" not in e["message"])]
    driver.quit()
    assert not problems, problems


def wait(driver, condition, timeout=60.0):
    return WebDriverWait(driver, timeout, poll_frequency=0.05).until(lambda d: condition(d))


def shown(driver, element_id: str) -> bool:
    return driver.find_element(By.ID, element_id).is_displayed()


def shot(driver, name: str, tmp_path: Path) -> None:
    folder = Path(os.environ.get("PODIUM_UI_SCREENSHOTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    driver.save_screenshot(str(folder / name))


def test_chat_streams_stops_and_is_found_again_from_the_server(browser, server_url, client,
                                                               tmp_path):
    started = time.monotonic()
    browser.get(server_url + "/")
    wait(browser, lambda d: d.find_element(By.ID, "model-state").text == "loaded")
    interactive = time.monotonic() - started
    assert browser.find_element(By.ID, "model").get_attribute("value") == MODEL
    print(f"page interactive (model listed and loaded) in {interactive:.2f} s")

    # one message: its answer is seen while it streams, then finished
    prompt = browser.find_element(By.ID, "prompt")
    prompt.send_keys("Write a Python function that reverses a string.", Keys.ENTER)
    wait(browser, lambda d: shown(d, "stop") and d.find_element(
        By.CSS_SELECTOR, ".message.assistant .body").text.strip())
    wait(browser, lambda d: not shown(d, "stop")
         and d.find_elements(By.XPATH, "//button[text()='Regenerate']"))
    answer = browser.find_element(By.CSS_SELECTOR, ".message.assistant .body").text
    assert "def " in answer and browser.find_elements(By.CSS_SELECTOR, ".code-bar .copy")
    title = browser.find_element(By.ID, "chat-title").text
    assert title == "Write a Python function that reverses a string."
    shot(browser, "ui-chat.png", tmp_path)

    # after a reload the conversation is listed from the server, and opens with its turn
    browser.refresh()
    entry = wait(browser, lambda d: [b for b in d.find_elements(
        By.CSS_SELECTOR, "#conversations button") if b.text.startswith(title)])[0]
    entry.click()
    wait(browser, lambda d: len(d.find_elements(By.CSS_SELECTOR, ".message")) == 2)
    assert browser.find_element(By.CSS_SELECTOR, ".message.assistant .body").text == answer

    # stop: the answer stops here and on the server (nothing left running, no turn stored)
    browser.find_element(By.ID, "prompt").send_keys(
        "Write a very long essay about the history of computing, in 40 sections.", Keys.ENTER)
    wait(browser, lambda d: len(d.find_elements(By.CSS_SELECTOR, ".message.assistant")) == 2
         and d.find_elements(By.CSS_SELECTOR, ".message.assistant .body")[-1].text.strip())
    browser.find_element(By.ID, "stop").click()
    wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, ".note.cancelled"), 10)
    assert not shown(browser, "stop") and shown(browser, "send")
    wait(browser, lambda d: httpx.get(f"{server_url}/health").json()["engine"]["running"] == 0,
         10)
    conversation = browser.find_element(By.CSS_SELECTOR, "#conversations li").get_attribute(
        "data-id")
    items = client.conversations.items.list(conversation, order="asc").data
    assert [i.role for i in items] == ["user", "assistant"]       # the stopped turn: not kept


def test_hostile_output_is_inert_and_the_page_responsive(browser, server_url, client,
                                                         tmp_path):
    conversation = client.conversations.create(metadata={"title": "hostile"}, items=[
        {"type": "message", "role": "user", "content": "Show me something."},
        {"type": "message", "role": "assistant", "content": HOSTILE}])
    browser.get(server_url + "/")
    entry = wait(browser, lambda d: [b for b in d.find_elements(
        By.CSS_SELECTOR, "#conversations button") if b.text.startswith("hostile")])[0]
    started = time.monotonic()
    entry.click()
    wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, ".message.assistant pre code"))
    rendered = time.monotonic() - started
    body = browser.find_element(By.CSS_SELECTOR, ".message.assistant .body")
    assert browser.execute_script("return window.__pwned") is None
    assert "<script>window.__pwned = 'script'</script>" in body.text     # shown as text
    assert not browser.find_elements(By.CSS_SELECTOR, "#messages img, #messages script")
    hrefs = [a.get_attribute("href") for a in body.find_elements(By.TAG_NAME, "a")]
    assert "http://127.0.0.1:9/tracker.png" in hrefs                     # a link, not loaded
    assert not any((h or "").startswith("javascript:") for h in hrefs)
    for link in body.find_elements(By.TAG_NAME, "a"):
        if link.text == "click me":
            link.click()                                                  # nothing runs
    assert browser.execute_script("return window.__pwned") is None
    lines = browser.execute_script(
        "return document.querySelector('#messages pre code').textContent.length")
    assert lines > 1_000_000
    wait(browser, lambda d: len(body.find_elements(By.CSS_SELECTOR, ".math .katex")) == 2, 10)
    started = time.monotonic()
    assert browser.execute_script("return 1 + 1") == 2
    assert time.monotonic() - started < 1
    print(f"1 MB answer rendered in {rendered:.2f} s")
    # the server view, from its JSON
    browser.find_element(By.ID, "tab-server").click()
    wait(browser, lambda d: MODEL in d.find_element(By.ID, "models-table").text
         and "loaded" in d.find_element(By.ID, "models-table").text)
    assert "budget" in browser.find_element(By.ID, "memory-label").text
    shot(browser, "ui-server.png", tmp_path)
    client.conversations.delete(conversation.id)


def test_the_key_prompt_and_one_keys_history(browser, tmp_path):
    with podium_serve("--api-key", "key-a", "--api-key", "key-b", "--ctx-size", "1024",
                      "--max-num-seqs", "1", "--log-level", "warning") as url:
        keyed = openai.OpenAI(base_url=f"{url}/v1", api_key="key-a", max_retries=0)
        made = keyed.conversations.create(metadata={"title": "only key a"})
        browser.get(url + "/")
        wait(browser, lambda d: shown(d, "key-dialog"))
        browser.find_element(By.ID, "key-input").send_keys("key-a", Keys.ENTER)
        wait(browser, lambda d: "only key a" in d.find_element(By.ID, "conversations").text)
        assert "key-a" not in browser.current_url
        # phone width: the conversations are behind the menu, nothing overflows
        browser.set_window_size(390, 844)
        assert browser.execute_script(
            "return document.documentElement.scrollWidth <= window.innerWidth")
        browser.find_element(By.ID, "menu").click()
        wait(browser, lambda d: d.find_element(By.ID, "conversations").is_displayed())
        browser.set_window_size(1200, 900)
        # another key: asked again after a wrong one, and sees none of key a's
        browser.find_element(By.ID, "key-button").click()
        browser.find_element(By.ID, "key-input").send_keys("wrong", Keys.ENTER)
        wait(browser, lambda d: "refused" in d.find_element(By.ID, "key-why").text)
        browser.find_element(By.ID, "key-input").send_keys("key-b", Keys.ENTER)
        wait(browser, lambda d: not shown(d, "key-dialog")
             and d.find_element(By.ID, "model").get_attribute("value") == MODEL)
        time.sleep(0.5)
        assert "only key a" not in browser.find_element(By.ID, "conversations").text
        keyed.conversations.delete(made.id)
        keyed.close()
