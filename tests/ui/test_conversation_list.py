"""GET /v1/conversations: the caller's conversations, newest first by default, in pages
(``after``, ``limit``, ``order``; ``first_id``, ``last_id``, ``has_more``) as OpenAI's other
lists; another key's are not there; bad parameters are 400s in OpenAI's shape."""

from __future__ import annotations

import pytest

A = {"authorization": "Bearer key-a"}
B = {"authorization": "Bearer key-b"}


@pytest.fixture
def client(scripted, client_for, tmp_path):
    return client_for(scripted(["Hi."]), api_key=["key-a", "key-b"],
                      store_url=f"sqlite:///{tmp_path / 'list.db'}")


def make(client, headers, title):
    response = client.post("/v1/conversations", json={"metadata": {"title": title}},
                           headers=headers)
    assert response.status_code == 200
    return response.json()["id"]


def test_pages_newest_first_per_key(client):
    ids = [make(client, A, f"t{n}") for n in range(5)]
    mine_b = make(client, B, "b")
    page = client.get("/v1/conversations", params={"limit": 2}, headers=A).json()
    assert page["object"] == "list" and page["has_more"] is True
    assert [c["id"] for c in page["data"]] == [ids[4], ids[3]]
    assert (page["first_id"], page["last_id"]) == (ids[4], ids[3])
    assert page["data"][0]["metadata"] == {"title": "t4"}
    assert page["data"][0]["object"] == "conversation"
    rest = client.get("/v1/conversations", params={"after": page["last_id"], "limit": 100},
                      headers=A).json()
    assert [c["id"] for c in rest["data"]] == [ids[2], ids[1], ids[0]]
    assert rest["has_more"] is False
    oldest = client.get("/v1/conversations", params={"order": "asc"}, headers=A).json()
    assert [c["id"] for c in oldest["data"]] == ids
    assert [c["id"] for c in client.get("/v1/conversations", headers=B).json()["data"]] == [
        mine_b]
    client.delete(f"/v1/conversations/{ids[4]}", headers=A)
    assert client.get("/v1/conversations", headers=A).json()["first_id"] == ids[3]


def test_empty_and_bad_parameters(client):
    empty = client.get("/v1/conversations", headers=A).json()
    assert empty == {"object": "list", "data": [], "first_id": None, "last_id": None,
                     "has_more": False}
    for bad in ({"limit": 0}, {"limit": 101}, {"order": "up"}):
        response = client.get("/v1/conversations", params=bad, headers=A)
        assert response.status_code == 400, bad
        assert response.json()["error"]["type"] == "invalid_request_error"
    assert client.get("/v1/conversations").status_code == 401
