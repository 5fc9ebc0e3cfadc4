"""Conversations as chains: each stored response keeps its own input items and its parent,
so storage grows linearly along a ``previous_response_id`` chain; ``chain`` rebuilds a
conversation in a fixed number of statements; deleting a response others continue from
leaves a tombstone that only ``chain`` sees, removed with the last response continuing it."""

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as Waiting

import pytest
import sqlalchemy as sa

import podium.store.sql
from podium.api.responses.log import fail_response
from podium.store.base import NO_OWNER, StoredResponse
from podium.store.sql import _GUARDED_APPEND, SQLStore, _ancestry
from tests.store.test_sql import OLD_SCHEMA

A, B = "key_aaaa", "key_bbbb"
SIZE = 400                      # characters of each turn's input text and of its output text


def turn(i, parent=None, owner=A, status="completed"):
    """Turn ``i`` as the API stores it: its own input item, its output, its parent's id."""
    rid = f"resp_{i:04d}"
    item = {"id": f"msg_{i:04d}", "type": "message", "role": "user",
            "content": [{"type": "input_text", "text": "q" * SIZE}]}
    output = [{"id": f"out_{i:04d}", "type": "message", "role": "assistant",
               "status": "completed",
               "content": [{"type": "output_text", "text": "a" * SIZE, "annotations": []}]}]
    body = {"id": rid, "object": "response", "status": status, "created_at": 1000.0 + i,
            "output": output, "previous_response_id": parent}
    return StoredResponse(id=rid, body=body, input_items=[item], owner=owner,
                          parent_id=parent)


def put_chain(store, turns, owner=A, first=1):
    """Turns ``first`` .. ``first + turns - 1``, each continuing the one before; their ids."""
    ids, parent = [], None
    for i in range(first, first + turns):
        record = turn(i, parent, owner)
        asyncio.run(store.put(record))
        ids.append(parent := record.id)
    return ids


def rows(store, table="podium_responses"):
    with store.engine.connect() as db:
        return db.execute(sa.text(f"SELECT count(*) FROM {table}")).scalar()


def ids(chain):
    return [r.id for r in chain]


def test_storage_grows_linearly_along_a_chain(open_store):
    store = open_store()
    chain = put_chain(store, 100)

    def stored(rid):
        with store.engine.connect() as db:
            row = db.execute(sa.text("SELECT length(body) + length(history) FROM "
                                     "podium_responses WHERE id = :id"), {"id": rid}).scalar()
            items = db.execute(sa.text("SELECT sum(length(body)) FROM podium_input_items "
                                       "WHERE response_id = :id"), {"id": rid}).scalar()
        return row + items

    assert stored(chain[9]) > 2 * SIZE
    assert stored(chain[99]) <= 1.5 * stored(chain[9])
    whole = asyncio.run(store.chain(chain[99], A))           # and nothing is lost
    assert ids(whole) == chain
    assert [r.input_items for r in whole] == [turn(i).input_items for i in range(1, 101)]
    assert [r.body["output"] for r in whole] == [turn(i).body["output"] for i in range(1, 101)]


def test_a_chain_is_its_responses_oldest_first_with_their_items(open_store):
    store = open_store()
    first, second, third = put_chain(store, 3)
    asyncio.run(store.put(turn(9, second)))                  # a branch off the second
    chain = asyncio.run(store.chain(third, A))
    assert ids(chain) == [first, second, third]
    assert [r.parent_id for r in chain] == [None, first, second]
    assert [r.input_items for r in chain] == [turn(i).input_items for i in (1, 2, 3)]
    assert [r.body for r in chain] == [turn(i, p).body for i, p in
                                       ((1, None), (2, first), (3, second))]
    assert all(r.history == [] and r.owner == A for r in chain)
    assert ids(asyncio.run(store.chain("resp_0009", A))) == [first, second, "resp_0009"]
    assert ids(asyncio.run(store.chain(first, A))) == [first]
    assert asyncio.run(store.chain(third, B)) is None
    assert asyncio.run(store.chain(third, NO_OWNER)) is None
    assert asyncio.run(store.chain("resp_missing", A)) is None
    assert asyncio.run(store.get(third, A)).parent_id == second


def test_a_chain_stops_at_another_owner_and_at_a_pruned_parent(open_store):
    store = open_store()
    chain = put_chain(store, 5)
    with store.engine.begin() as db:                         # not the API's doing, but
        db.execute(sa.text("UPDATE podium_responses SET owner = :b WHERE id = :id"),
                   {"b": B, "id": chain[1]})
    assert ids(asyncio.run(store.chain(chain[2], A))) == chain[2:3]
    assert asyncio.run(store.prune(1002.5)) == 2             # turns 1 and 2: by age
    assert ids(asyncio.run(store.chain(chain[4], A))) == chain[2:]


def test_a_chain_ends_on_a_cycle_and_at_the_limit(open_store, monkeypatch):
    store = open_store()
    chain = put_chain(store, 10)
    with store.engine.begin() as db:                         # a database gone wrong
        db.execute(sa.text("UPDATE podium_responses SET parent_id = :last WHERE id = :first"),
                   {"last": chain[2], "first": chain[0]})
    assert ids(asyncio.run(store.chain(chain[2], A))) == chain[:3]
    with store.engine.connect() as db:                       # the SQL walk ends there too
        assert db.execute(sa.select(sa.func.count()).select_from(
            _ancestry(chain[2], A))).scalar() == 3
    assert ids(asyncio.run(store.chain(chain[9], A))) == chain
    monkeypatch.setattr(podium.store.sql, "CHAIN_LIMIT", 4)
    assert ids(asyncio.run(store.chain(chain[9], A))) == chain[6:]


def test_a_chain_takes_the_same_statements_for_any_length(open_store):
    store = open_store()
    short, long = put_chain(store, 5), put_chain(store, 50, first=100)
    statements = []
    sa.event.listen(store.engine, "before_cursor_execute",
                    lambda *args: statements.append(args[2]))

    def count(rid):
        statements.clear()
        chain = asyncio.run(store.chain(rid, A))
        assert chain and chain[0].input_items
        return len(statements)

    assert count(short[-1]) == count(long[-1]) <= 2
    assert len(asyncio.run(store.chain(long[-1], A))) == 50


def test_a_deleted_parent_is_kept_for_its_children_until_the_last_goes(open_store):
    store = open_store()
    parent = turn(1, status="in_progress")
    parent.body["background"] = True
    asyncio.run(store.put(parent))
    assert asyncio.run(store.append_events(parent.id, [{"type": "response.created",
                                                        "sequence_number": 0}]))
    child, other = turn(2, parent.id), turn(3, parent.id)
    asyncio.run(store.put(child))
    asyncio.run(store.put(other))

    assert asyncio.run(store.delete(parent.id, A)) is True
    # missing to everything a client reaches, and to the writers
    assert asyncio.run(store.get(parent.id, A)) is None
    assert asyncio.run(store.input_items(parent.id, A, after=None, limit=5,
                                         order="asc")) == ([], False)
    assert asyncio.run(store.events_after(parent.id, -1)) == []
    assert asyncio.run(store.append_events(parent.id, [{"type": "response.in_progress",
                                                        "sequence_number": 1}])) is False
    assert asyncio.run(store.chain(parent.id, A)) is None
    assert asyncio.run(store.fail_unfinished("stopped", fail_response)) == []
    assert asyncio.run(store.delete(parent.id, A)) is False
    assert store.count() == 2 and rows(store) == 3
    # ... but not to its children's chains
    for kid in (child, other):
        chain = asyncio.run(store.chain(kid.id, A))
        assert ids(chain) == [parent.id, kid.id]
        assert chain[0].input_items == parent.input_items
        assert chain[0].body["output"] == parent.body["output"]

    assert asyncio.run(store.delete(child.id, A)) is True    # one child left: kept
    assert rows(store) == 2
    assert ids(asyncio.run(store.chain(other.id, A))) == [parent.id, other.id]
    assert asyncio.run(store.delete(other.id, A)) is True    # the last: both go
    assert rows(store) == 0 and rows(store, "podium_input_items") == 0
    assert rows(store, "podium_events") == 0


def test_deleting_the_last_of_a_chain_removes_its_tombstones_above(open_store):
    store = open_store()
    first, second, third, fourth = put_chain(store, 4)
    assert asyncio.run(store.delete(second, A)) is True
    assert asyncio.run(store.delete(third, A)) is True
    assert asyncio.run(store.delete(first, A)) is True
    assert rows(store) == 4 and store.count() == 1
    assert ids(asyncio.run(store.chain(fourth, A))) == [first, second, third, fourth]
    assert asyncio.run(store.delete(fourth, A)) is True
    assert rows(store) == 0 and rows(store, "podium_input_items") == 0


def test_deleting_a_child_keeps_a_live_parent(open_store):
    store = open_store()
    first, second = put_chain(store, 2)
    assert asyncio.run(store.delete(second, A)) is True
    assert rows(store) == 1
    assert ids(asyncio.run(store.chain(first, A))) == [first]


# the tables as Podium made them after owners, before chains
OWNERS_SCHEMA = [*OLD_SCHEMA, "ALTER TABLE podium_responses ADD COLUMN owner VARCHAR(64) "
                 "NOT NULL DEFAULT ''"]


@pytest.mark.parametrize("schema", [OLD_SCHEMA, OWNERS_SCHEMA],
                         ids=["before owners", "before chains"])
def test_a_database_from_before_chains_is_migrated(url, open_store, schema):
    history = [{"id": "msg_a", "type": "message", "role": "user", "content": "hello"},
               {"id": "out_a", "type": "message", "role": "assistant", "content": "hi"},
               {"id": "msg_b", "type": "message", "role": "user", "content": "and?"}]
    engine = sa.create_engine(url.replace("postgresql://", "postgresql+psycopg://"))
    with engine.begin() as db:
        for statement in schema:
            db.execute(sa.text(statement))
        db.execute(sa.text("INSERT INTO podium_responses (id, created_at, status, body, "
                           "history) VALUES ('resp_old', 1.0, 'completed', "
                           "'{\"id\": \"resp_old\"}', :history)"),
                   {"history": podium.store.sql._dumps(history)})
        db.execute(sa.text("INSERT INTO podium_input_items VALUES ('resp_old', 0, 'msg_b', "
                           ":body)"), {"body": podium.store.sql._dumps(history[2])})
    engine.dispose()
    with ThreadPoolExecutor(2) as pool:                # replicas starting together
        store, _ = pool.map(lambda _: open_store(), range(2))

    (old,) = asyncio.run(store.chain("resp_old", NO_OWNER))
    assert old.history == history and old.input_items == [history[2]]
    assert old.parent_id is None and old.body == {"id": "resp_old"}
    child = turn(1, "resp_old", owner=NO_OWNER)
    asyncio.run(store.put(child))
    assert ids(asyncio.run(store.chain(child.id, NO_OWNER))) == ["resp_old", child.id]
    assert asyncio.run(store.delete("resp_old", NO_OWNER)) is True     # a tombstone
    assert asyncio.run(store.chain(child.id, NO_OWNER))[0].history == history
    assert "ix_podium_responses_parent_id" in {
        i["name"] for i in sa.inspect(store.engine).get_indexes("podium_responses")}
    open_store()                                       # and again: nothing left to do


# -- PostgreSQL: deletes that keep a tombstone, racing the other writers ----------------


def pause_after(store, fragment):
    """Hold ``store``'s first statement containing ``fragment``, once it has run, until
    released."""
    reached, release = threading.Event(), threading.Event()

    def hold(conn, cursor, statement, *rest):
        if fragment in statement and not reached.is_set():
            reached.set()
            assert release.wait(10)
    sa.event.listen(store.engine, "after_cursor_execute", hold)
    return reached, release


def test_postgres_a_tombstoning_delete_waits_for_an_append(pg_url):
    store = SQLStore(pg_url)
    try:
        parent = turn(1, status="in_progress")
        asyncio.run(store.put(parent))
        asyncio.run(store.put(turn(2, parent.id)))
        with store.engine.connect() as db, ThreadPoolExecutor(1) as pool:
            append = db.begin()                        # an append on another replica
            db.execute(_GUARDED_APPEND, {"response_id": parent.id, "seq": 0, "body": "{}"})
            deleting = pool.submit(store._delete, parent.id, A)
            with pytest.raises(Waiting):
                deleting.result(timeout=0.5)
            append.commit()
            assert deleting.result(timeout=10) is True
        assert asyncio.run(store.events_after(parent.id, -1)) == []
        assert asyncio.run(store.append_events(parent.id, [{"sequence_number": 1}])) is False
        assert rows(store) == 2 and rows(store, "podium_events") == 0
    finally:
        store.engine.dispose()


def test_postgres_a_delete_waits_for_a_child_being_put_and_keeps_the_parent(pg_url):
    putting, deleting = SQLStore(pg_url), SQLStore(pg_url)     # two replicas
    try:
        parent = turn(1)
        asyncio.run(putting.put(parent))
        reached, release = pause_after(putting, "FOR KEY SHARE")
        with ThreadPoolExecutor(2) as pool:
            put = pool.submit(putting._put, turn(2, parent.id))
            assert reached.wait(10)
            delete = pool.submit(deleting._delete, parent.id, A)
            with pytest.raises(Waiting):
                delete.result(timeout=0.5)             # held by the put
            release.set()
            put.result(timeout=10)
            assert delete.result(timeout=10) is True
        assert ids(asyncio.run(deleting.chain("resp_0002", A))) == [parent.id, "resp_0002"]
    finally:
        putting.engine.dispose()
        deleting.engine.dispose()


def test_postgres_deleting_parent_and_child_at_once_leaves_nothing(pg_url):
    parent_side, child_side = SQLStore(pg_url), SQLStore(pg_url)
    try:
        parent, child = put_chain(child_side, 2)
        # the parent's delete holds it and has seen the child: it will keep a tombstone
        reached, release = pause_after(parent_side, "WHERE podium_responses.parent_id =")
        with ThreadPoolExecutor(2) as pool:
            deleting_parent = pool.submit(parent_side._delete, parent, A)
            assert reached.wait(10)
            # the child's delete removes the child, then must wait to look at the parent
            deleting_child = pool.submit(child_side._delete, child, A)
            with pytest.raises(Waiting):
                deleting_child.result(timeout=0.5)
            release.set()
            assert deleting_parent.result(timeout=10) is True
            assert deleting_child.result(timeout=10) is True
        assert rows(child_side) == 0 and rows(child_side, "podium_input_items") == 0
    finally:
        parent_side.engine.dispose()
        child_side.engine.dispose()
