"""Schema versions: a database made by the release before versions (48c3ca9: responses with
owners, chains and tombstones; no leases, no conversations, no recorded version), with
responses in it, opens with nothing lost, records its version, and takes new writes; a
database from a newer Podium is refused at start."""

import asyncio
import time

import orjson
import pytest
import sqlalchemy as sa

from podium.api.responses.log import fail_response
from podium.store.base import StoredResponse
from podium.store.sql import SCHEMA_VERSION, SQLStore

OWNER = "key_aaaa"

# the tables exactly as release 48c3ca9 declared them
release = sa.MetaData()
sa.Table(
    "podium_responses", release,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("created_at", sa.Float, nullable=False, index=True),
    sa.Column("status", sa.String(16), nullable=False, index=True),
    sa.Column("body", sa.Text, nullable=False),
    sa.Column("history", sa.Text, nullable=False),
    sa.Column("owner", sa.String(64), nullable=False, server_default=""),
    sa.Column("parent_id", sa.String(64), nullable=True, index=True),
    sa.Column("deleted", sa.Boolean, nullable=False, server_default=sa.false()),
)
sa.Table(
    "podium_input_items", release,
    sa.Column("response_id", sa.String(64), primary_key=True),
    sa.Column("position", sa.Integer, primary_key=True),
    sa.Column("item_id", sa.String(64), nullable=False),
    sa.Column("body", sa.Text, nullable=False),
)
sa.Table(
    "podium_events", release,
    sa.Column("response_id", sa.String(64), primary_key=True),
    sa.Column("seq", sa.Integer, primary_key=True),
    sa.Column("body", sa.Text, nullable=False),
)
sa.Table(
    "podium_probes", release,
    sa.Column("id", sa.String(32), primary_key=True),
    sa.Column("body", sa.LargeBinary, nullable=False),
)


def body(rid, status="completed", text="hello"):
    return {"id": rid, "object": "response", "status": status, "created_at": time.time(),
            "output": [{"id": f"msg_{rid}", "type": "message", "role": "assistant",
                        "content": [{"type": "output_text", "text": text}]}]}


def item(rid):
    return {"id": f"in_{rid}", "type": "message", "role": "user", "content": f"turn {rid}"}


def release_database(url: str) -> None:
    """A database the release made and used: a chain of three (its middle one deleted, so a
    tombstone), an event log, and a response still in progress when it stopped."""
    engine = sa.create_engine(url.replace("postgresql://", "postgresql+psycopg://"))
    release.create_all(engine)
    t = release.tables
    rows = [("resp_1", None, False, "completed"), ("resp_2", "resp_1", True, "completed"),
            ("resp_3", "resp_2", False, "completed"), ("resp_run", None, False, "in_progress")]
    with engine.begin() as db:
        for rid, parent, deleted, status in rows:
            db.execute(sa.insert(t["podium_responses"]).values(
                id=rid, created_at=time.time(), status=status,
                body=orjson.dumps(body(rid, status)).decode(), history="[]", owner=OWNER,
                parent_id=parent, deleted=deleted))
            db.execute(sa.insert(t["podium_input_items"]).values(
                response_id=rid, position=0, item_id=f"in_{rid}",
                body=orjson.dumps(item(rid)).decode()))
        db.execute(sa.insert(t["podium_events"]), [
            {"response_id": "resp_run", "seq": i,
             "body": orjson.dumps({"type": kind, "sequence_number": i,
                                   "response": body("resp_run", "in_progress")}).decode()}
            for i, kind in enumerate(["response.created", "response.in_progress"])])
    engine.dispose()


def test_a_release_database_opens_with_nothing_lost(url, open_store):
    release_database(url)
    store = open_store()
    with store.engine.connect() as db:
        assert db.execute(sa.text("SELECT version FROM podium_schema")).scalar() \
            == SCHEMA_VERSION
    assert asyncio.run(store.get("resp_1", OWNER)).body == body("resp_1") | {
        "created_at": asyncio.run(store.get("resp_1", OWNER)).body["created_at"]}
    assert asyncio.run(store.get("resp_2", OWNER)) is None          # still a tombstone
    chain = asyncio.run(store.chain("resp_3", OWNER))
    assert [r.id for r in chain] == ["resp_1", "resp_2", "resp_3"]
    assert [r.input_items for r in chain] == [[item("resp_1")], [item("resp_2")],
                                              [item("resp_3")]]
    items, more = asyncio.run(store.input_items("resp_3", OWNER, after=None, limit=10,
                                                order="asc"))
    assert items == [item("resp_3")] and not more
    # the release's unfinished response holds no lease: failed at start, its log closed
    assert asyncio.run(store.fail_unfinished("stopped", fail_response)) == ["resp_run"]
    events = asyncio.run(store.events_after("resp_run", -1))
    assert [e["type"] for e in events] == ["response.created", "response.in_progress",
                                           "response.failed"]
    # and it takes what this version writes: a leased response continuing the chain
    record = StoredResponse("resp_4", body("resp_4", "in_progress"), [], [item("resp_4")],
                            OWNER, parent_id="resp_3")
    asyncio.run(store.put(record, ("replica_a", time.time() + 30)))
    assert asyncio.run(store.fail_unfinished("stopped", fail_response)) == []
    assert [r.id for r in asyncio.run(store.chain("resp_4", OWNER))][-2:] == ["resp_3",
                                                                            "resp_4"]
    open_store()                                        # opened again: nothing to do


def test_a_database_from_a_newer_podium_is_refused(url, open_store):
    open_store()
    engine = sa.create_engine(url.replace("postgresql://", "postgresql+psycopg://"))
    with engine.begin() as db:
        db.execute(sa.text("UPDATE podium_schema SET version = :v"),
                   {"v": SCHEMA_VERSION + 1})
    engine.dispose()
    with pytest.raises(RuntimeError, match=f"schema version {SCHEMA_VERSION + 1}, newer"):
        SQLStore(url)
