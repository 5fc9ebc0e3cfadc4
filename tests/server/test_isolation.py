"""API keys: stored responses belong to the key that made them; the rate limit counts by key.

Another key's response is answered exactly like a missing one (404, same message), on every
route that reaches a stored response; a server without keys has one owner.
"""

import sqlite3
import time

import pytest
from starlette.testclient import TestClient

from podium.server.app import create_app
from podium.settings import Settings
from tests.conftest import SERVED
from tests.server.responses_check import check_stream, sse_events

URL = "/v1/responses"
A, B = {"authorization": "Bearer key-a"}, {"authorization": "Bearer key-b"}


@pytest.fixture
def serve(scripted, tmp_path):
    """An app (lifespan running) on a scripted engine and a SQLite store in ``tmp_path``."""
    clients = []

    def build(replies, db="r.db", **settings):
        pacing = {k: settings.pop(k) for k in ("delay",) if k in settings}
        app = create_app(Settings(store_url=f"sqlite:///{tmp_path / db}", **settings),
                         scripted(replies, **pacing))
        client = TestClient(app, raise_server_exceptions=False)
        client.__enter__()
        clients.append(client)
        return client
    yield build
    for client in clients:
        client.__exit__(None, None, None)


def ask(**extra):
    return {"model": SERVED, "input": "Weather in Paris?", **extra}


def missing(rid):
    return {"error": {"message": f"No response with id {rid!r}",
                      "type": "invalid_request_error", "param": "response_id", "code": None}}


def wait_for(c, rid, status, headers):
    deadline = time.monotonic() + 10
    while (body := c.get(f"{URL}/{rid}", headers=headers).json())["status"] != status:
        assert time.monotonic() < deadline, body
        time.sleep(0.02)
    return body


def test_another_keys_response_is_not_found_on_every_route(serve):
    c = serve(["Hello there!"], api_key=["key-a", "key-b"])
    rid = c.post(URL, json=ask(), headers=A).json()["id"]
    streamed = sse_events(c.post(URL, json=ask(stream=True), headers=A).text)
    sid = streamed[0]["response"]["id"]
    reach = [("GET", f"{URL}/{rid}"), ("GET", f"{URL}/{rid}/input_items"),
             ("GET", f"{URL}/{sid}?stream=true"), ("POST", f"{URL}/{rid}/cancel"),
             ("DELETE", f"{URL}/{rid}")]
    for method, path in reach:
        r = c.request(method, path, headers=B)
        wanted = missing(sid if sid in path else rid)
        assert (r.status_code, r.json()) == (404, wanted), (method, path)
    r = c.post(URL, json=ask(previous_response_id=rid), headers=B)
    assert r.status_code == 404 and r.json()["error"]["param"] == "previous_response_id"
    assert r.json()["error"]["message"] == missing(rid)["error"]["message"]
    # the owner still has everything B tried to reach
    assert c.get(f"{URL}/{rid}", headers=A).json()["status"] == "completed"
    assert c.get(f"{URL}/{rid}/input_items", headers=A).json()["data"]
    check_stream(sse_events(c.get(f"{URL}/{sid}?stream=true", headers=A).text))
    nxt = c.post(URL, json=ask(previous_response_id=rid), headers=A)
    assert nxt.status_code == 200
    assert c.delete(f"{URL}/{rid}", headers=A).json()["deleted"] is True
    # and once it is gone, the owner's 404 is the one B had: B learnt nothing
    assert c.get(f"{URL}/{rid}", headers=A).json() == missing(rid)


def test_another_key_cannot_cancel_or_delete_a_running_response(serve):
    c = serve(["word " * 300], delay=0.01, api_key=["key-a", "key-b"])
    rid = c.post(URL, json=ask(background=True), headers=A).json()["id"]
    wait_for(c, rid, "in_progress", A)
    assert c.post(f"{URL}/{rid}/cancel", headers=B).status_code == 404
    assert c.delete(f"{URL}/{rid}", headers=B).status_code == 404
    r = c.get(f"{URL}/{rid}?stream=true", headers=B)
    assert r.status_code == 404 and r.json() == missing(rid)
    assert c.get(f"{URL}/{rid}", headers=A).json()["status"] == "in_progress"
    assert c.post(f"{URL}/{rid}/cancel", headers=A).json()["status"] == "cancelled"


def test_the_key_is_not_stored(serve, tmp_path):
    c = serve(["ok"], api_key=["key-a-secret-value"])
    c.post(URL, json=ask(), headers={"authorization": "Bearer key-a-secret-value"})
    for path in tmp_path.glob("r.db*"):
        assert b"key-a-secret-value" not in path.read_bytes()
    with sqlite3.connect(tmp_path / "r.db") as db:
        (owner,) = db.execute("SELECT owner FROM podium_responses").fetchone()
    assert owner.startswith("key_") and "secret" not in owner


def test_one_owner_without_keys_and_keys_do_not_see_its_responses(serve):
    open_server = serve(["ok"], db="shared.db")
    rid = open_server.post(URL, json=ask()).json()["id"]
    assert open_server.get(f"{URL}/{rid}").status_code == 200
    assert open_server.get(f"{URL}/{rid}", headers=A).status_code == 200   # no keys: ignored
    keyed = serve(["ok"], db="shared.db", api_key=["key-a"])
    assert keyed.get(f"{URL}/{rid}", headers=A).json() == missing(rid)


CHAT = "/v1/chat/completions"


def test_rate_limit_counts_the_key_however_the_header_is_spelled(serve):
    c = serve(["ok"], rate_limit_per_minute=2, api_key=["k1", "k2"])
    body = {"model": SERVED, "messages": [{"role": "user", "content": "hi"}]}
    spellings = ["Bearer k1", "bearer k1", "BEARER   k1 ", "Bearer  k1"]
    codes = [c.post(CHAT, json=body, headers={"authorization": s}).status_code
             for s in spellings]
    assert codes == [200, 200, 429, 429]
    assert c.post(CHAT, json=body, headers={"authorization": "bearer k2"}).status_code == 200


def test_rate_limit_without_keys_ignores_the_authorization_header(serve):
    c = serve(["ok"], rate_limit_per_minute=1)
    body = {"model": SERVED, "messages": [{"role": "user", "content": "hi"}]}
    codes = [c.post(CHAT, json=body, headers={"authorization": f"Bearer x{i}"}).status_code
             for i in range(2)]
    assert codes == [200, 429]
