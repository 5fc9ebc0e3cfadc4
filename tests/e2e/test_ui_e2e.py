"""The web UI in a real browser: Debian's headless Chromium, driven by Selenium, against one
real ``podium serve`` for the module (the default model, loaded at start, and a second one
loaded on demand; an operator's key and a tenant's) and one browser session, each test on a
freshly loaded page. A message streams in; a stopped answer stops on the server; the
conversation is found again after a reload, from the server; regenerate and edit-and-resend
replace the turn on the server; presets are kept and sent; a text file goes in as input
text and an image is refused saying why; a conversation exported, imported, renamed and
deleted; the second model loads from the picker, shown loading then loaded; hostile model
output (script tags, ``onerror``, ``javascript:`` links, a remote image, a 1 MB code block)
is shown inert beside typeset math and the page stays responsive; the page asks for a key,
and another key does not see the first one's conversations. Every test must pass without a
script error or a Content-Security-Policy violation in the page.

Where the point is the page, turns are seeded through the Conversations API or kept to a
few tokens (the settings' max output tokens); streaming and stop use the default model as
a user would. ``PODIUM_UI_SCREENSHOTS=DIR`` keeps the chat and server views' screenshots
there (docs/)."""

from __future__ import annotations

import json
import os
import re
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
from selenium.webdriver.support import expected_conditions  # noqa: E402
from selenium.webdriver.support.ui import Select, WebDriverWait  # noqa: E402

SECOND = "second"           # the default model's file again, under another name: on demand
KEY = "key-a"               # the operator's (--admin-key): it may load models from the picker
OTHER = "key-b"             # a tenant's

HOSTILE = ("Here you go: $$\\int_0^1 x^2\\,dx = \\tfrac13$$ and\n\n\\[e^{i\\pi} + 1 = 0\\]\n\n<script>window.__pwned = 'script'</script>\n\n"
           "<img src=x onerror=\"window.__pwned = 'img'\">\n\n"
           "[click me](javascript:window.__pwned='link') and "
           "![remote](http://127.0.0.1:9/tracker.png)\n\n"
           "```python\n" + "x = '<img src=y onerror=alert(1)>'\n" * 30_000 + "```\n")

# the request bodies the page sends, recorded in the page (its fetch wrapped)
SPY = """window.__sent = [];
const fetched = window.fetch;
window.fetch = (url, options) => {
  window.__sent.push([options?.method ?? 'GET', String(url), options?.body ?? null]);
  return fetched(url, options);
};"""
# every text the picker's state shows, recorded from now on
WATCH_STATE = """window.__states = [];
new MutationObserver(() => window.__states.push(document.getElementById('model-state')
  .textContent)).observe(document.getElementById('model-state'),
  {childList: true, characterData: true, subtree: true});"""
PNG = bytes.fromhex("89504e470d0a1a0a0000000d4948445200000001000000010806000000"
                    "1f15c4890000000d49444154789c63000100000500010d0a2db40000000049454e44ae426082")


@pytest.fixture(scope="module")
def server():
    with podium_serve("--model", MODEL, "--model", f"{SECOND}={MODEL}", "--preload", MODEL,
                      "--keep-alive", "0", "--admin-key", KEY, "--api-key", OTHER,
                      "--ctx-size", "4096", "--log-level", "warning") as url:
        yield url


@pytest.fixture(scope="module")
def client(server):
    sdk = openai.OpenAI(base_url=f"{server}/v1", api_key=KEY, max_retries=0)
    yield sdk
    sdk.close()


@pytest.fixture(scope="module")
def downloads(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("downloads")


@pytest.fixture(scope="module")
def browser(server, downloads):
    """One headless Chromium for the module; its first page asks for the key, given here
    (kept in the tab's session storage)."""
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                "--window-size=1200,900"):
        options.add_argument(arg)
    options.add_experimental_option("prefs", {"download.default_directory": str(downloads),
                                              "download.prompt_for_download": False})
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(DRIVER), options=options)
    try:
        started = time.monotonic()
        driver.get(server + "/")
        wait(driver, lambda d: shown(d, "key-dialog"))
        print(f"key prompt shown in {time.monotonic() - started:.2f} s")
        driver.find_element(By.ID, "key-input").send_keys(KEY, Keys.ENTER)
        wait(driver, lambda d: d.find_element(By.ID, "model-state").text == "loaded")
        yield driver
    finally:
        driver.quit()


@pytest.fixture(autouse=True)
def page(browser, server):
    """A freshly loaded page (this browser's settings, presets and model choice forgotten;
    the key kept), and no script error or policy violation while the test used it."""
    browser.execute_script("localStorage.clear()")
    browser.get(server + "/")
    wait(browser, lambda d: d.find_element(By.ID, "model-state").text == "loaded")
    yield browser
    # (a refused key's 401 is logged as a failed resource: expected)
    problems = [e["message"] for e in browser.get_log("browser")
                if "Content Security Policy" in e["message"] or (
                    e["level"] == "SEVERE" and "Failed to load resource" not in e["message"])]
    assert not problems, problems


def wait(driver, condition, timeout=60.0):
    return WebDriverWait(driver, timeout, poll_frequency=0.05).until(lambda d: condition(d))


def shown(driver, element_id: str) -> bool:
    return driver.find_element(By.ID, element_id).is_displayed()


def shot(driver, name: str, tmp_path: Path) -> None:
    folder = Path(os.environ.get("PODIUM_UI_SCREENSHOTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    driver.save_screenshot(str(folder / name))


def texts(driver, selector: str) -> list[str]:
    return [e.text for e in driver.find_elements(By.CSS_SELECTOR, selector)]


def open_conversation(driver, title: str) -> None:
    """Opens the conversation called ``title`` from the list (read again: a reload)."""
    driver.refresh()
    entry = wait(driver, lambda d: [b for b in d.find_elements(
        By.CSS_SELECTOR, "#conversations button") if b.text.startswith(title)])[0]
    entry.click()
    wait(driver, lambda d: d.find_element(By.ID, "chat-title").text == title
         and d.find_elements(By.CSS_SELECTOR, ".message"))


def turn_done(driver) -> bool:
    """The last turn has ended and the page shows what the server holds (its buttons)."""
    return not shown(driver, "stop") and bool(driver.find_elements(
        By.XPATH, "//button[text()='Regenerate']"))


def current_conversation(driver) -> str:
    return driver.find_element(By.CSS_SELECTOR, "#conversations button[aria-current='true']"
                               ).find_element(By.XPATH, "..").get_attribute("data-id")


def stored(client, conversation: str) -> list:
    return client.conversations.items.list(conversation, order="asc").data


def text_of(item) -> str:
    return "".join(part.text for part in item.content)


def shows(shown_text: str, markdown: str) -> bool:
    """The page shows this answer (its markdown rendered: the same words)."""
    return shown_text.split() == re.sub(r"[*`]", "", markdown).split()


def few_tokens(driver, count: int) -> None:
    """The settings' max output tokens: a short turn, where the page is the point."""
    driver.find_element(By.ID, "settings-toggle").click()
    field = driver.find_element(By.ID, "max_output_tokens")
    field.clear()
    field.send_keys(str(count))
    driver.find_element(By.ID, "settings-toggle").click()


def preset_names(driver) -> list[str]:
    return [o.get_attribute("textContent") for o in Select(
        driver.find_element(By.ID, "preset")).options]


def sent(driver, path: str) -> list[dict]:
    return [json.loads(body) for method, url, body in driver.execute_script(
        "return window.__sent") if method == "POST" and url == path]


def test_chat_streams_stops_and_is_found_again_from_the_server(browser, server, client,
                                                               tmp_path):
    started = time.monotonic()
    browser.get(server + "/")
    wait(browser, lambda d: d.find_element(By.ID, "model-state").text == "loaded")
    interactive = time.monotonic() - started
    assert browser.find_element(By.ID, "model").get_attribute("value") == MODEL
    print(f"page interactive (model listed and loaded) in {interactive:.2f} s")

    # one message: its answer is seen while it streams, then finished
    prompt = browser.find_element(By.ID, "prompt")
    prompt.send_keys("Write a Python function that reverses a string.", Keys.ENTER)
    wait(browser, lambda d: shown(d, "stop") and d.find_element(
        By.CSS_SELECTOR, ".message.assistant .body").text.strip())
    wait(browser, turn_done)
    answer = browser.find_element(By.CSS_SELECTOR, ".message.assistant .body").text
    assert "def " in answer and browser.find_elements(By.CSS_SELECTOR, ".code-bar .copy")
    title = browser.find_element(By.ID, "chat-title").text
    assert title == "Write a Python function that reverses a string."
    shot(browser, "ui-chat.png", tmp_path)

    # after a reload the conversation is listed from the server, and opens with its turn
    open_conversation(browser, title)
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
    wait(browser, lambda d: httpx.get(f"{server}/health").json()[
        "models"][MODEL]["engine"]["running"] == 0, 10)
    items = stored(client, current_conversation(browser))
    assert [i.role for i in items] == ["user", "assistant"]       # the stopped turn: not kept


def test_regenerate_and_edit_and_resend_replace_turns_on_the_server(browser, client):
    seeded = client.conversations.create(metadata={"title": "two turns"}, items=[
        {"type": "message", "role": "user", "content": "Say one word: apple"},
        {"type": "message", "role": "assistant", "content": "apple"},
        {"type": "message", "role": "user", "content": "Say one word: pear"},
        {"type": "message", "role": "assistant", "content": "pear"}])
    before = stored(client, seeded.id)
    few_tokens(browser, 6)
    open_conversation(browser, "two turns")
    assert texts(browser, ".message .body") == ["Say one word: apple", "apple",
                                                "Say one word: pear", "pear"]

    # regenerate: the last turn (its question and answer) sent again, stored anew
    browser.find_element(By.XPATH, "//button[text()='Regenerate']").click()
    wait(browser, lambda d: shown(d, "stop"))
    wait(browser, turn_done)
    after = stored(client, seeded.id)
    assert [i.id for i in after[:2]] == [i.id for i in before[:2]]        # kept
    assert len(after) == 4 and {i.id for i in after[2:]}.isdisjoint(i.id for i in before)
    assert text_of(after[2]) == "Say one word: pear" and after[3].role == "assistant"
    assert texts(browser, ".message .body")[:3] == ["Say one word: apple", "apple",
                                                    "Say one word: pear"]
    assert shows(texts(browser, ".message .body")[3], text_of(after[3]))

    # edit the first question: it and everything after it replaced by the edited turn
    first = browser.find_elements(By.CSS_SELECTOR, ".message.user")[0]
    first.find_element(By.XPATH, ".//button[text()='Edit']").click()
    box = first.find_element(By.CSS_SELECTOR, "textarea.edit-box")
    assert box.get_attribute("value") == "Say one word: apple"
    box.clear()
    box.send_keys("Say one word: plum")
    first.find_element(By.XPATH, ".//button[text()='Send']").click()
    wait(browser, lambda d: len(d.find_elements(By.CSS_SELECTOR, ".message")) == 2
         and turn_done(d))
    edited = stored(client, seeded.id)
    assert [i.role for i in edited] == ["user", "assistant"]
    assert text_of(edited[0]) == "Say one word: plum"
    assert not {i.id for i in edited} & {i.id for i in after}
    [question, answer] = texts(browser, ".message .body")
    assert question == "Say one word: plum" and shows(answer, text_of(edited[1]))
    client.conversations.delete(seeded.id)


def test_presets_are_kept_in_the_browser_and_sent(browser, server, client):
    browser.find_element(By.ID, "settings-toggle").click()
    fields = {"system": "Answer in French.", "temperature": "0", "max_output_tokens": "5"}
    for name, value in fields.items():
        browser.find_element(By.ID, name).send_keys(value)
    browser.find_element(By.ID, "save-preset").click()
    asked = WebDriverWait(browser, 5).until(expected_conditions.alert_is_present())
    asked.send_keys("terse")
    asked.accept()
    preset = Select(browser.find_element(By.ID, "preset"))
    assert preset.first_selected_option.text == "terse"
    for name in fields:
        browser.find_element(By.ID, name).clear()
    preset.select_by_value("")
    preset.select_by_value("terse")                               # fills them back
    assert {n: browser.find_element(By.ID, n).get_attribute("value") for n in fields} == fields

    # kept across a reload (this browser's storage), and sent with the next turn
    browser.get(server + "/")
    wait(browser, lambda d: d.find_element(By.ID, "model-state").text == "loaded")
    browser.find_element(By.ID, "settings-toggle").click()
    assert {n: browser.find_element(By.ID, n).get_attribute("value") for n in fields} == fields
    assert preset_names(browser) == ["(none)", "terse"]
    browser.execute_script(SPY)
    browser.find_element(By.ID, "prompt").send_keys("Say hello and tell me about Paris.",
                                                    Keys.ENTER)
    wait(browser, turn_done)
    [body] = sent(browser, "/v1/responses")
    assert (body["instructions"], body["temperature"], body["max_output_tokens"]) == (
        "Answer in French.", 0, 5)
    conversation = current_conversation(browser)
    items = stored(client, conversation)
    assert [i.role for i in items] == ["user", "assistant"]
    assert len(text_of(items[1]).split()) <= 5                    # cut at 5 tokens

    # deleted: gone from the list, after a reload too
    Select(browser.find_element(By.ID, "preset")).select_by_value("terse")
    browser.find_element(By.ID, "delete-preset").click()
    browser.get(server + "/")
    wait(browser, lambda d: d.find_element(By.ID, "model-state").text == "loaded")
    assert preset_names(browser) == ["(none)"]
    client.conversations.delete(conversation)


def test_a_text_file_goes_in_as_input_text_and_an_image_is_refused(browser, client,
                                                                   tmp_path):
    notes, picture, binary = tmp_path / "notes.txt", tmp_path / "cat.png", tmp_path / "blob.bin"
    notes.write_text("The secret word is zebra.\n")
    picture.write_bytes(PNG)
    binary.write_bytes(b"\xff\xfe\x00\x81 not text")
    few_tokens(browser, 8)
    browser.find_element(By.ID, "attach").send_keys(f"{picture}\n{notes}\n{binary}")
    wait(browser, lambda d: "notes.txt" in d.find_element(By.ID, "attachments").text)
    assert shown(browser, "composer-error")
    refusals = browser.find_element(By.ID, "composer-error").text.splitlines()
    assert refusals == [
        "cat.png: images cannot be sent; the models this server runs read text only.",
        "blob.bin is not a text file (not UTF-8)."]
    chips = texts(browser, "#attachments .chip")
    assert len(chips) == 1 and chips[0].startswith("notes.txt")   # only the text file
    browser.execute_script(SPY)
    browser.find_element(By.ID, "prompt").send_keys("What is the secret word?", Keys.ENTER)
    wait(browser, turn_done)
    assert not shown(browser, "composer-error")
    [body] = sent(browser, "/v1/responses")
    assert [p["type"] for p in body["input"][0]["content"]] == ["input_text", "input_text"]
    conversation = current_conversation(browser)
    [user, answer] = stored(client, conversation)
    assert [p.text for p in user.content] == [
        "What is the secret word?", "File notes.txt:\n```\nThe secret word is zebra.\n\n```"]
    assert answer.role == "assistant"
    assert "The secret word is zebra." in browser.find_element(
        By.CSS_SELECTOR, ".message.user .body").text
    assert not browser.find_elements(By.CSS_SELECTOR, "#attachments .chip")  # sent: cleared
    client.conversations.delete(conversation)


def test_a_conversation_exported_imported_renamed_and_deleted(browser, client, downloads):
    original = client.conversations.create(metadata={"title": "to export"}, items=[
        {"type": "message", "role": "user", "content": "What is 2 + 2?"},
        {"type": "message", "role": "assistant", "content": "**4**, as `2 + 2 == 4`."}])
    open_conversation(browser, "to export")
    browser.find_element(By.ID, "export").click()
    exported = downloads / "to_export.json"
    wait(browser, lambda d: exported.is_file() and exported.stat().st_size > 0, 10)
    data = json.loads(exported.read_text())
    assert data["format"] == "podium.conversation.v1"
    assert data["conversation"]["id"] == original.id
    held = stored(client, original.id)
    assert [i["id"] for i in data["items"]] == [i.id for i in held]
    assert [i["content"][0]["text"] for i in data["items"]] == [text_of(i) for i in held]

    # imported: a new conversation of this key with the same turns, opened
    browser.find_element(By.ID, "import-file").send_keys(str(exported))
    wait(browser, lambda d: d.find_element(By.ID, "chat-title").text == "to export"
         and current_conversation(d) != original.id
         and len(d.find_elements(By.CSS_SELECTOR, ".message")) == 2)
    copy = current_conversation(browser)
    assert [(i.role, text_of(i)) for i in stored(client, copy)] == [
        (i.role, text_of(i)) for i in held]
    assert browser.find_element(By.CSS_SELECTOR, ".message.assistant strong").text == "4"

    # renamed and deleted, on the server
    browser.find_element(By.ID, "rename").click()
    asked = WebDriverWait(browser, 5).until(expected_conditions.alert_is_present())
    asked.send_keys("imported copy")
    asked.accept()
    wait(browser, lambda d: d.find_element(By.ID, "chat-title").text == "imported copy")
    assert client.conversations.retrieve(copy).metadata["title"] == "imported copy"
    assert "imported copy" in browser.find_element(By.ID, "conversations").text
    browser.find_element(By.ID, "delete").click()
    WebDriverWait(browser, 5).until(expected_conditions.alert_is_present()).accept()
    wait(browser, lambda d: d.find_element(By.ID, "chat-title").text == "New chat")
    with pytest.raises(openai.NotFoundError):
        client.conversations.retrieve(copy)
    assert "imported copy" not in browser.find_element(By.ID, "conversations").text
    client.conversations.delete(original.id)


def test_a_second_model_loads_from_the_picker_shown_loading_then_loaded(browser, server):
    assert httpx.get(f"{server}/v1/models/{SECOND}", headers={
        "authorization": f"Bearer {KEY}"}).json()["state"] == "unloaded"
    browser.execute_script(WATCH_STATE)
    browser.execute_script(SPY)
    Select(browser.find_element(By.ID, "model")).select_by_value(SECOND)
    wait(browser, lambda d: d.find_element(By.ID, "model-state").text == "loaded", 60)
    states = browser.execute_script("return window.__states")
    assert states[0].startswith("loading…") and states[-1] == "loaded", states
    health = httpx.get(f"{server}/health").json()["models"][SECOND]
    assert health["state"] == "loaded" and health["loads"] == 1
    assert [path for method, path, _ in browser.execute_script("return window.__sent")
            if method == "POST"] == [f"/v1/models/{SECOND}/load"]
    # the picker's words for a load the server reports a fraction of (llama.cpp), and one
    # it does not (vLLM): seconds only
    said = browser.execute_async_script("""const done = arguments[0];
        import('/ui/js/models.js').then((m) => done([
          m.describe({id: 'x', state: 'loading', load_progress: 0.427})[0],
          m.describe({id: 'y', state: 'loading', load_progress: null})[0]]));""")
    assert said == ["loading… 42% 0 s", "loading… 0 s"]
    # the choice is kept, and the next message goes to that model
    browser.get(server + "/")
    wait(browser, lambda d: d.find_element(By.ID, "model").get_attribute("value") == SECOND
         and d.find_element(By.ID, "model-state").text == "loaded")
    few_tokens(browser, 3)
    browser.execute_script(SPY)
    browser.find_element(By.ID, "prompt").send_keys("Hi", Keys.ENTER)
    wait(browser, turn_done)
    assert [b["model"] for b in sent(browser, "/v1/responses")] == [SECOND]
    assert httpx.get(f"{server}/health").json()["models"][SECOND]["engine"][
        "generated_tokens"] > 0
    httpx.post(f"{server}/v1/models/{SECOND}/unload", headers={
        "authorization": f"Bearer {KEY}"}, timeout=60)


def test_hostile_output_is_inert_and_the_page_responsive(browser, client, tmp_path):
    conversation = client.conversations.create(metadata={"title": "hostile"}, items=[
        {"type": "message", "role": "user", "content": "Show me something."},
        {"type": "message", "role": "assistant", "content": HOSTILE}])
    browser.refresh()
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


def test_the_key_prompt_and_one_keys_history(browser, server, client):
    made = client.conversations.create(metadata={"title": "only key a"})
    first = browser.current_window_handle
    browser.switch_to.new_window("tab")         # its own session storage: no key yet
    try:
        browser.get(server + "/")
        wait(browser, lambda d: shown(d, "key-dialog"))
        assert "This server needs an API key." in browser.find_element(By.ID, "key-why").text
        browser.find_element(By.ID, "key-input").send_keys(KEY, Keys.ENTER)
        wait(browser, lambda d: "only key a" in d.find_element(By.ID, "conversations").text)
        assert KEY not in browser.current_url
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
        browser.find_element(By.ID, "key-input").send_keys(OTHER, Keys.ENTER)
        wait(browser, lambda d: not shown(d, "key-dialog")
             and d.find_element(By.ID, "model").get_attribute("value") == MODEL)
        time.sleep(0.5)
        assert "only key a" not in browser.find_element(By.ID, "conversations").text
        # a tenant may not load a model by hand: the picker says it loads with the first
        # message, which loads it (shown loading, then loaded)
        admin = {"authorization": f"Bearer {KEY}"}
        httpx.post(f"{server}/v1/models/{SECOND}/unload", headers=admin, timeout=60)
        loads = httpx.get(f"{server}/health").json()["models"][SECOND]["loads"]
        browser.refresh()
        wait(browser, lambda d: d.find_element(By.ID, "model-state").text == "loaded")
        Select(browser.find_element(By.ID, "model")).select_by_value(SECOND)
        wait(browser, lambda d: d.find_element(By.ID, "model-state").text
             == "unloaded: loads with the first message", 10)
        assert httpx.get(f"{server}/health").json()["models"][SECOND]["loads"] == loads
        few_tokens(browser, 3)
        browser.execute_script(WATCH_STATE)
        browser.find_element(By.ID, "prompt").send_keys("Hi", Keys.ENTER)
        wait(browser, turn_done)
        wait(browser, lambda d: d.find_element(By.ID, "model-state").text == "loaded", 10)
        assert any(s.startswith("loading…") for s in browser.execute_script(
            "return window.__states"))
        assert httpx.get(f"{server}/health").json()["models"][SECOND]["loads"] == loads + 1
        httpx.post(f"{server}/v1/models/{SECOND}/unload", headers=admin, timeout=60)
    finally:
        browser.close()
        browser.switch_to.window(first)
        client.conversations.delete(made.id)
