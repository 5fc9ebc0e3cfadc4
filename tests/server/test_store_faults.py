"""The Responses store when things go wrong: a full disk, a delete mid-stream, a crash, and
requests that reach a response that is not finished."""

import json
import sqlite3
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import sqlalchemy as sa
from starlette.testclient import TestClient

from podium.server.app import create_app
from podium.settings import Settings
from tests.conftest import SERVED
from tests.server.responses_check import check_stream, sse_events

URL = "/v1/responses"


@pytest.fixture
def serve(scripted, tmp_path):
    """An app (lifespan running) on a scripted engine and a SQLite store in ``tmp_path``;
    ``stop(client)`` ends its lifespan the way a stopped server does."""
    clients = []

    def build(replies, db="r.db", **settings):
        pacing = {k: settings.pop(k) for k in ("delay",) if k in settings}
        engine = scripted(replies, **pacing)
        app = create_app(Settings(store_url=f"sqlite:///{tmp_path / db}", **settings), engine)
        client = TestClient(app, raise_server_exceptions=False)
        client.__enter__()
        client.engine, client.running = engine, True
        clients.append(client)
        return client
    yield build
    for client in clients:
        stop(client)


def stop(client):
    if client.running:
        client.running = False
        client.__exit__(None, None, None)


def ask(**extra):
    return {"model": SERVED, "input": "Weather in Paris?", **extra}


def rows(db, rid):
    """Rows anywhere in the store that belong to response ``rid``."""
    with sqlite3.connect(db) as conn:
        return {table: conn.execute(f"SELECT count(*) FROM {table} WHERE {column} = ?",
                                    (rid,)).fetchone()[0]
                for table, column in (("podium_responses", "id"),
                                      ("podium_input_items", "response_id"),
                                      ("podium_events", "response_id"))}


def wait_for(c, rid, status):
    deadline = time.monotonic() + 10
    while (body := c.get(f"{URL}/{rid}").json())["status"] != status:
        assert time.monotonic() < deadline, body
        time.sleep(0.02)
    return body


# -- a full disk ------------------------------------------------------------------------


def fill_up(store):
    """From now on the database cannot grow by a page: SQLite's own SQLITE_FULL, as on a full
    disk, for every write that needs room (max_page_count is per connection, so set on each
    new one and the pooled ones dropped)."""
    def freeze(conn, _record):
        (pages,) = conn.execute("PRAGMA page_count").fetchone()
        conn.execute(f"PRAGMA max_page_count = {pages}")
    sa.event.listen(store.engine, "connect", freeze)
    store.engine.dispose()


def test_a_full_store_fails_cleanly_before_any_work(serve):
    c = serve(["Hello there!"])
    assert c.post(URL, json=ask()).status_code == 200
    fill_up(c.app.state.store)
    big = ask(input="word " * 1500)         # more than a page: it needs room to be stored
    generated = len(c.engine.requests)
    for extra in ({}, {"stream": True}, {"background": True}):
        r = c.post(URL, json={**big, **extra})
        assert r.status_code == 503, (extra, r.text)
        assert r.headers["content-type"] == "application/json"      # not a started stream
        error = r.json()["error"]
        assert error["code"] == "store_unavailable" and "full" in error["message"]
    assert len(c.engine.requests) == generated      # nothing was generated
    assert c.engine.stats["running"] == 0
    ready = c.get("/ready")
    assert ready.status_code == 503 and "full" in ready.json()["store"]
    assert c.post(URL, json={**big, "store": False}).status_code == 200    # still serving


def test_ready_writes_to_the_store(serve):
    c = serve(["ok"])
    assert c.get("/ready").json()["status"] == "ready"
    assert c.get("/ready").status_code == 200       # the probe cleans up after itself


# -- delete while it streams ------------------------------------------------------------


def test_delete_while_streaming_leaves_nothing_behind(serve, tmp_path):
    c = serve(["word " * 200], delay=0.005)
    events, rid = [], None
    with c.stream("POST", URL, json=ask(stream=True)) as r:
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            events.append(json.loads(line[6:]))
            if len(events) == 40:
                rid = events[0]["response"]["id"]
                assert rows(tmp_path / "r.db", rid)["podium_events"] > 0
                assert c.delete(f"{URL}/{rid}").json()["deleted"] is True
    check_stream(events)                   # the client still got its whole answer
    stop(c)                                # every last write has been made
    assert rows(tmp_path / "r.db", rid) == {
        "podium_responses": 0, "podium_input_items": 0, "podium_events": 0}


# -- what a request may continue from ---------------------------------------------------


def test_previous_response_still_running_is_refused(serve):
    c = serve(["word " * 300], delay=0.01)
    rid = c.post(URL, json=ask(background=True)).json()["id"]
    wait_for(c, rid, "in_progress")
    r = c.post(URL, json=ask(previous_response_id=rid))
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "previous_response_id"
    assert "in_progress" in r.json()["error"]["message"]


@pytest.mark.parametrize("tools", [None, [], [{"type": "web_search"}]])
def test_tool_choice_required_needs_tools(serve, tools):
    c = serve(["ok"])
    r = c.post(URL, json=ask(tool_choice="required", tools=tools))
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "tool_choice"


@pytest.mark.parametrize("fmt", ["json", ["json_object"], 3])
def test_text_format_must_be_an_object(serve, fmt):
    c = serve(["ok"])
    r = c.post(URL, json=ask(text={"format": fmt}))
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "text.format"


def test_the_response_says_whether_it_is_stored(serve):
    c = serve(["ok"])
    assert c.post(URL, json=ask()).json()["store"] is True
    assert c.post(URL, json=ask(store=False)).json()["store"] is False
    events = sse_events(c.post(URL, json=ask(stream=True, store=False)).text)
    assert events[0]["response"]["store"] is False and events[-1]["response"]["store"] is False


def test_a_stored_response_is_recorded_before_it_is_generated(serve, tmp_path):
    c = serve(["word " * 60], delay=0.01)
    with ThreadPoolExecutor(1) as pool:
        answer = pool.submit(c.post, URL, json=ask())
        with sqlite3.connect(tmp_path / "r.db") as db:
            while not (running := db.execute("SELECT id FROM podium_responses WHERE status "
                                              "= 'in_progress'").fetchall()):
                assert not answer.done(), "no in-progress record while it was generated"
                time.sleep(0.005)
        body = answer.result(timeout=10).json()
    assert running == [(body["id"],)] and body["status"] == "completed"
    assert c.get(f"{URL}/{body['id']}").json() == body


# -- after a crash ----------------------------------------------------------------------


def test_interrupted_response_keeps_what_its_log_holds(serve, tmp_path):
    first = serve(["word " * 300], db="crash.db", delay=0.01)
    rid = first.post(URL, json=ask(background=True)).json()["id"]
    wait_for(first, rid, "in_progress")
    deadline = time.monotonic() + 10
    while rows(tmp_path / "crash.db", rid)["podium_events"] < 12:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    stop(first)                           # left in progress, its log cut mid-text
    second = serve(["ok"], db="crash.db")  # the next start marks it failed
    body = second.get(f"{URL}/{rid}").json()
    assert body["status"] == "failed"
    log = sse_events(second.get(f"{URL}/{rid}?stream=true").text)
    final = check_stream(log)              # every item added is done, then response.failed
    assert final == body                   # the object and its log agree
    written = "".join(e["delta"] for e in log if e["type"] == "response.output_text.delta")
    (message,) = body["output"]
    assert message["status"] == "incomplete"
    assert message["content"][0]["text"] == written and written.startswith("word word")
