"""The conversation store on SQLite and PostgreSQL: owners, ordered pages, appends that stay
together under concurrency, deletes racing appends, retention."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
import sqlalchemy as sa

from podium.store.conversations import ConversationStore, ItemIdTaken


def item(n: int | str) -> dict:
    return {"id": f"msg_{n}", "type": "message", "role": "user", "content": str(n)}


def test_owners_pages_and_items(open_store):
    store = ConversationStore(open_store().engine)

    async def run():
        made = await store.create("conv_1", "key_a", {"k": "v"}, [item(i) for i in range(5)])
        assert made == {"id": "conv_1", "object": "conversation",
                        "created_at": made["created_at"], "metadata": {"k": "v"}}
        assert await store.get("conv_1", "key_a") == made
        for other in ("key_b", ""):         # another owner: as missing as a missing id
            assert await store.get("conv_1", other) is None
            assert await store.items("conv_1", other, after=None, limit=10,
                                     order="asc") is None
            assert not await store.append("conv_1", other, [item("x")])
            assert await store.delete_item("conv_1", other, "msg_0") == (None, False)
            assert await store.update("conv_1", other, {}) is None
            assert not await store.delete("conv_1", other)
        page, more = await store.items("conv_1", "key_a", after="msg_1", limit=2, order="asc")
        assert [i["id"] for i in page] == ["msg_2", "msg_3"] and more
        page, more = await store.items("conv_1", "key_a", after="msg_1", limit=2, order="desc")
        assert [i["id"] for i in page] == ["msg_0"] and not more
        assert await store.item("conv_1", "key_a", "msg_4") == (True, item(4))
        assert await store.item("conv_1", "key_a", "msg_9") == (True, None)
        assert (await store.delete_item("conv_1", "key_a", "msg_4"))[1]
        assert await store.append("conv_1", "key_a", [item(5)])
        assert [i["id"] for i in await store.all_items("conv_1", "key_a")] == [
            "msg_0", "msg_1", "msg_2", "msg_3", "msg_5"]
        assert await store.delete("conv_1", "key_a")
        assert await store.all_items("conv_1", "key_a") is None
    asyncio.run(run())


def test_concurrent_appends_stay_together_in_commit_order(open_store):
    """Appends from many threads (each its own connection): every batch contiguous."""
    engine = open_store().engine
    store = ConversationStore(engine)
    asyncio.run(store.create("conv_c", "", {}, []))
    start = threading.Barrier(8)

    def writer(w: int) -> None:
        start.wait()
        for b in range(5):
            assert store._append("conv_c", "", [item(f"{w}.{b}.{k}") for k in range(4)])

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ids = [i["id"] for i in asyncio.run(store.all_items("conv_c", ""))]
    assert len(ids) == 8 * 5 * 4
    batches = [ids[i:i + 4] for i in range(0, len(ids), 4)]
    for batch in batches:
        prefix = batch[0].rsplit(".", 1)[0]
        assert batch == [f"{prefix}.{k}" for k in range(4)]
    for w in range(8):          # each writer's batches in the order it made them
        mine = [b[0] for b in batches if b[0].startswith(f"msg_{w}.")]
        assert mine == [f"msg_{w}.{b}.0" for b in range(5)]


def test_a_delete_racing_appends_leaves_nothing(open_store):
    store = ConversationStore(open_store().engine)
    asyncio.run(store.create("conv_d", "", {}, []))
    results: list[bool] = []

    def writer() -> None:
        while store._append("conv_d", "", [item(f"a{len(results)}"), item(f"b{len(results)}")]):
            results.append(True)

    thread = threading.Thread(target=writer)
    thread.start()
    time.sleep(0.05)
    assert store._delete("conv_d", "")
    thread.join(timeout=10)
    assert not thread.is_alive()
    with store.engine.connect() as db:
        assert db.exec_driver_sql("SELECT count(*) FROM podium_conversation_items "
                                  "WHERE conversation_id = 'conv_d'").scalar() == 0


def test_an_append_with_a_taken_id_adds_nothing(open_store):
    """Ids are unique within a conversation, checked in the appending transaction: two
    appends racing with one id cannot both add it."""
    store = ConversationStore(open_store().engine)
    asyncio.run(store.create("conv_u", "", {}, [item(1)]))
    with pytest.raises(ItemIdTaken) as err:
        store._append("conv_u", "", [item(2), item(1)])
    assert err.value.item_id == "msg_1"
    assert store._append("conv_u", "other", [item(1)]) is False     # not theirs: no answer
    outcomes: list[str] = []
    start = threading.Barrier(6)

    def writer() -> None:
        start.wait()
        try:
            outcomes.append("added" if store._append("conv_u", "", [item(3)]) else "missing")
        except ItemIdTaken:
            outcomes.append("taken")

    threads = [threading.Thread(target=writer) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes) == ["added"] + ["taken"] * 5
    assert [i["id"] for i in asyncio.run(store.all_items("conv_u", ""))] == ["msg_1", "msg_3"]


def test_prune_by_last_update(open_store):
    store = ConversationStore(open_store().engine)

    async def run():
        await store.create("conv_old", "", {}, [item(1)])
        await store.create("conv_kept", "", {}, [item(2)])
        cutoff = time.time() + 1
        with store.engine.begin() as db:
            db.exec_driver_sql("UPDATE podium_conversations SET updated_at = updated_at + 100 "
                               "WHERE id = 'conv_kept'")
        assert await store.prune(cutoff) == 1
        assert await store.get("conv_old", "") is None
        assert await store.all_items("conv_kept", "") == [item(2)]
        with store.engine.connect() as db:
            assert db.exec_driver_sql("SELECT count(*) FROM podium_conversation_items "
                                      "WHERE conversation_id = 'conv_old'").scalar() == 0
    asyncio.run(run())


def test_listing_pages_by_owner_in_creation_order(open_store):
    """The owner's conversations only, oldest or newest first, a page and a cursor at a
    time; the listing's index is there (made at start in a database without it too)."""
    engine = open_store().engine
    store = ConversationStore(engine)

    async def run():
        for n in range(5):
            await store.create(f"conv_a{n}", "key_a", {"title": f"t{n}"}, [item(n)])
        await store.create("conv_b0", "key_b", {}, [])
        page, more = await store.page("key_a", after=None, limit=2, order="desc")
        assert [c["id"] for c in page] == ["conv_a4", "conv_a3"] and more
        assert page[0] == {"id": "conv_a4", "object": "conversation",
                           "created_at": page[0]["created_at"], "metadata": {"title": "t4"}}
        page, more = await store.page("key_a", after="conv_a3", limit=2, order="desc")
        assert [c["id"] for c in page] == ["conv_a2", "conv_a1"] and more
        page, more = await store.page("key_a", after="conv_a1", limit=2, order="desc")
        assert [c["id"] for c in page] == ["conv_a0"] and not more
        page, more = await store.page("key_a", after="conv_a1", limit=10, order="asc")
        assert [c["id"] for c in page] == ["conv_a2", "conv_a3", "conv_a4"] and not more
        # another owner's id is no cursor: from the start
        page, _ = await store.page("key_a", after="conv_b0", limit=1, order="asc")
        assert [c["id"] for c in page] == ["conv_a0"]
        assert await store.page("key_c", after=None, limit=10, order="desc") == ([], False)
        assert [c["id"] for c in (await store.page("key_b", after=None, limit=10,
                                                   order="desc"))[0]] == ["conv_b0"]
    asyncio.run(run())
    with engine.begin() as db:
        db.execute(sa.text("DROP INDEX ix_podium_conversations_owner"))
    ConversationStore(engine)
    assert "ix_podium_conversations_owner" in {
        i["name"] for i in sa.inspect(engine).get_indexes("podium_conversations")}
