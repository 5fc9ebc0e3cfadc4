"""The SQL store on SQLite and, when one is running, PostgreSQL: owners, deletes that race a
log writer, databases made before owners existed, and the rebuild after a crash."""

import asyncio
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as Waiting

import pytest
import sqlalchemy as sa

from podium.api.responses.log import fail_response
from podium.render.responses import recover
from podium.store.base import NO_OWNER, StoredResponse
from podium.store.sql import _GUARDED_APPEND, SQLStore
from tests.store.test_recover import logged_stream

A, B = "key_aaaa", "key_bbbb"

# the tables as Podium made them before responses had owners
OLD_SCHEMA = [
    "CREATE TABLE podium_responses (id VARCHAR(64) NOT NULL, created_at FLOAT NOT NULL, "
    "status VARCHAR(16) NOT NULL, body TEXT NOT NULL, history TEXT NOT NULL, PRIMARY KEY (id))",
    "CREATE INDEX ix_podium_responses_status ON podium_responses (status)",
    "CREATE INDEX ix_podium_responses_created_at ON podium_responses (created_at)",
    "CREATE TABLE podium_input_items (response_id VARCHAR(64) NOT NULL, position INTEGER NOT "
    "NULL, item_id VARCHAR(64) NOT NULL, body TEXT NOT NULL, PRIMARY KEY (response_id, "
    "position))",
    "CREATE TABLE podium_events (response_id VARCHAR(64) NOT NULL, seq INTEGER NOT NULL, "
    "body TEXT NOT NULL, PRIMARY KEY (response_id, seq))",
]


def record(rid="resp_1", owner=A, status="completed"):
    body = {"id": rid, "object": "response", "status": status, "created_at": 1.0,
            "output": [], "background": True}
    items = [{"id": "msg_in", "type": "message", "role": "user", "content": "hi"}]
    return StoredResponse(rid, body, items, items, owner)


def event(seq, kind="response.in_progress"):
    return {"type": kind, "sequence_number": seq}


def test_every_read_is_the_owners(open_store):
    store = open_store()
    asyncio.run(store.put(record(owner=A)))
    assert asyncio.run(store.get("resp_1", A)).body["status"] == "completed"
    assert asyncio.run(store.get("resp_1", B)) is None
    assert asyncio.run(store.get("resp_1", NO_OWNER)) is None
    assert asyncio.run(store.input_items("resp_1", B, after=None, limit=5,
                                         order="asc")) == ([], False)
    assert asyncio.run(store.input_items("resp_1", A, after=None, limit=5,
                                         order="asc"))[0][0]["id"] == "msg_in"
    assert asyncio.run(store.delete("resp_1", B)) is False
    assert asyncio.run(store.delete("resp_1", A)) is True
    assert asyncio.run(store.get("resp_1", A)) is None


def test_a_deleted_response_takes_no_more_events_from_any_replica(open_store):
    writer, other = open_store(), open_store()       # two replicas, one database
    asyncio.run(writer.put(record(status="in_progress")))
    assert asyncio.run(writer.append_events("resp_1", [event(0), event(1)])) is True
    assert asyncio.run(other.delete("resp_1", A)) is True
    assert asyncio.run(writer.append_events("resp_1", [event(2), event(3)])) is False
    assert asyncio.run(writer.events_after("resp_1", -1)) == []


def test_a_database_from_before_owners_is_migrated(url, open_store):
    engine = sa.create_engine(url.replace("postgresql://", "postgresql+psycopg://"))
    with engine.begin() as db:
        for statement in OLD_SCHEMA:
            db.execute(sa.text(statement))
        db.execute(sa.text("INSERT INTO podium_responses VALUES ('resp_old', 1.0, "
                           "'completed', '{\"id\": \"resp_old\"}', '[]')"))
    engine.dispose()
    with ThreadPoolExecutor(2) as pool:                # replicas starting together
        first, second = pool.map(lambda _: open_store(), range(2))
    assert asyncio.run(first.get("resp_old", NO_OWNER)).body == {"id": "resp_old"}
    assert asyncio.run(second.get("resp_old", A)) is None
    asyncio.run(second.put(record(owner=A)))
    assert asyncio.run(first.get("resp_1", A)) is not None
    open_store()                                       # and again: nothing left to do


def test_a_crashed_response_is_failed_with_the_output_its_log_holds(open_store):
    store = open_store()
    events, _ = logged_stream()
    cut = next(i for i, e in enumerate(events) if e.get("delta") == "sunny ") + 1
    asyncio.run(store.put(record(status="in_progress")))
    asyncio.run(store.append_events("resp_1", events[:cut]))
    assert asyncio.run(store.fail_unfinished("stopped", fail_response)) == ["resp_1"]
    body = asyncio.run(store.get("resp_1", A)).body
    assert body["status"] == "failed" and body["error"]["message"] == "stopped"
    output, closing = recover(events[:cut])
    assert body["output"] == output and output[1]["content"][0]["text"] == "It is sunny "
    tail = asyncio.run(store.events_after("resp_1", cut - 1))
    assert [e["type"] for e in tail] == [e["type"] for e in closing] + ["response.failed"]
    assert [e["sequence_number"] for e in tail] == list(range(cut, cut + len(tail)))
    assert tail[-1]["response"] == body


def test_the_probe_writes(open_store):
    store = open_store()
    asyncio.run(store.ping())
    asyncio.run(store.ping())
    with store.engine.connect() as db:
        assert db.execute(sa.text("SELECT count(*) FROM podium_probes")).scalar() == 0


# -- PostgreSQL: a delete and an append in flight at once -------------------------------


def test_postgres_delete_waits_for_an_append_and_takes_its_events(pg_url):
    store = SQLStore(pg_url)
    try:
        asyncio.run(store.put(record(status="in_progress")))
        with store.engine.connect() as db, ThreadPoolExecutor(1) as pool:
            append = db.begin()                        # an append on another replica
            db.execute(_GUARDED_APPEND, {"response_id": "resp_1", "seq": 0, "body": "{}"})
            deleting = pool.submit(store._delete, "resp_1", A)
            with pytest.raises(Waiting):
                deleting.result(timeout=0.5)           # held by the append's row lock
            append.commit()
            assert deleting.result(timeout=10) is True
        assert asyncio.run(store.events_after("resp_1", -1)) == []
    finally:
        store.engine.dispose()


def test_postgres_append_waits_for_a_delete_and_adds_nothing(pg_url):
    store = SQLStore(pg_url)
    try:
        asyncio.run(store.put(record(status="in_progress")))
        with store.engine.connect() as db, ThreadPoolExecutor(1) as pool:
            delete = db.begin()                        # a delete on another replica
            db.execute(sa.text("DELETE FROM podium_responses WHERE id = 'resp_1'"))
            appending = pool.submit(store._append, "resp_1", [event(0), event(1)])
            with pytest.raises(Waiting):
                appending.result(timeout=0.5)
            delete.commit()
            assert appending.result(timeout=10) is False
        with store.engine.connect() as db:
            assert db.execute(sa.text("SELECT count(*) FROM podium_events")).scalar() == 0
    finally:
        store.engine.dispose()


def test_events_after_can_stop_at_a_limit(open_store):
    """Asking whether a log exists reads one row, not the whole log."""
    store = open_store()
    events, _ = logged_stream()
    asyncio.run(store.put(record(status="in_progress")))
    asyncio.run(store.append_events("resp_1", events))
    assert len(events) > 3
    first = asyncio.run(store.events_after("resp_1", -1, 1))
    assert first == events[:1]
    assert asyncio.run(store.events_after("resp_1", 0, 2)) == events[1:3]
    assert asyncio.run(store.events_after("resp_1", -1)) == events
