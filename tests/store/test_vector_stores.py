"""VectorStoreStore on SQLite and PostgreSQL: ownership, exact counts and usage, claims and
leases of files being ingested (two replicas never hold one; a lapsed lease is claimed
again and its chunks begun again), writes refused once a file is deleted or cancelled, and
what a search reads (completed files only, the revision moving on)."""

from __future__ import annotations

import asyncio
import time

import numpy as np

from podium.store.vector_stores import VectorStoreStore


def _store(open_store) -> VectorStoreStore:
    return VectorStoreStore(open_store().engine)


def _file(store_id: str, file_id: str, owner: str = "o", batch_id: str | None = None) -> dict:
    return dict(store_id=store_id, file_id=file_id, owner=owner, batch_id=batch_id,
                filename=f"{file_id}.txt", attributes={"k": file_id}, chunk_size=800,
                chunk_overlap=400, created_at=int(time.time()))


async def _make(store: VectorStoreStore, store_id: str = "vs_1", owner: str = "o",
                files: tuple[str, ...] = ()) -> None:
    now = int(time.time())
    await store.create(dict(id=store_id, owner=owner, name="n", description=None,
                            meta={"a": "b"}, embedding_model="m", chunk_size=800,
                            chunk_overlap=400, created_at=now, expires_days=None,
                            expires_at=None, last_active_at=now),
                       [_file(store_id, f, owner) for f in files])


def _vec(*values: float) -> bytes:
    return np.asarray(values, dtype="<f4").tobytes()


def test_stores_belong_to_their_owner(open_store):
    async def go():
        store = _store(open_store)
        await _make(store, "vs_1", "alice", ("file-a",))
        assert (await store.get("vs_1", "alice"))["meta"] == {"a": "b"}
        assert await store.get("vs_1", "bob") is None
        assert await store.get_file("vs_1", "file-a", "bob") is None
        assert not await store.delete("vs_1", "bob")
        assert not await store.delete_file("vs_1", "file-a", "bob")
        assert (await store.page("bob", None, None, 10, "desc")) == ([], False)
        assert await store.delete("vs_1", "alice")
        assert await store.get_file("vs_1", "file-a", "alice") is None
    asyncio.run(go())


def test_counts_and_usage_are_counted_from_the_files(open_store):
    async def go():
        store = _store(open_store)
        await _make(store, files=("file-a", "file-b", "file-c"))
        now = time.time()
        claimed = [await store.claim_file("A", now + 30, now) for _ in range(3)]
        assert {c["file_id"] for c in claimed} == {"file-a", "file-b", "file-c"}
        assert claimed[0]["embedding_model"] == "m"
        assert await store.claim_file("A", now + 30, now) is None
        a, b = ("vs_1", "file-a"), ("vs_1", "file-b")
        assert await store.add_chunks(a, "A", now + 30, [(0, "hello", _vec(1, 0))])
        assert await store.finish_file(a, "A", "completed", 13, None)
        assert await store.finish_file(b, "A", "failed", 0, {"code": "invalid_file",
                                                               "message": "x"})
        counts, usage = (await store.stats(["vs_1"]))["vs_1"]
        assert counts == {"completed": 1, "failed": 1, "in_progress": 1} and usage == 13
        assert (await store.get_file("vs_1", "file-b", "o"))["last_error"]["code"] == \
            "invalid_file"
    asyncio.run(go())


def test_two_replicas_never_claim_one_file_and_a_lapsed_lease_starts_over(open_store):
    async def go():
        store = _store(open_store)
        await _make(store, files=tuple(f"file-{i}" for i in range(6)))
        now = time.time()
        got = await asyncio.gather(*(store.claim_file(r, now + 0.2, now) for r in "ABCABC"))
        assert sorted(g["file_id"] for g in got) == [f"file-{i}" for i in range(6)]
        first = got[0]
        key = (first["store_id"], first["file_id"])
        holder = "ABCABC"[0]
        assert await store.add_chunks(key, holder, now + 0.2, [(0, "t", _vec(1, 0))])
        later = now + 1                                     # every lease lapsed
        again = [await store.claim_file("Z", later + 30, later) for _ in range(6)]
        assert {(g["store_id"], g["file_id"]) for g in again} >= {key}
        # the loser's writes are refused, and the winner starts with no chunks
        assert not await store.add_chunks(key, holder, later + 30, [(1, "u", _vec(0, 1))])
        assert not await store.finish_file(key, holder, "completed", 1, None)
        assert await store.file_chunks(*key, 10) == []
    asyncio.run(go())


def test_delete_and_cancel_stop_an_ingestion(open_store):
    async def go():
        store = _store(open_store)
        await _make(store, files=("file-a",))
        now = int(time.time())
        await store.add_files([_file("vs_1", "file-b", batch_id="vsfb_1")],
                              dict(id="vsfb_1", store_id="vs_1", owner="o",
                                   status="in_progress", created_at=now))
        a = await store.claim_file("A", now + 30, now)
        b = await store.claim_file("A", now + 30, now)
        assert await store.delete_file(*(a["store_id"], a["file_id"]), "o")
        assert not await store.add_chunks((a["store_id"], a["file_id"]), "A", now + 30, [])
        assert await store.cancel_batch("vs_1", "vsfb_1", "o")
        assert not await store.cancel_batch("vs_1", "vsfb_1", "o")     # once
        row, counts = await store.get_batch("vs_1", "vsfb_1", "o")
        assert row["status"] == "cancelled" and counts == {"cancelled": 1}
        assert not await store.finish_file((b["store_id"], b["file_id"]), "A", "completed",
                                           1, None)
        assert await store.get_batch("vs_1", "vsfb_1", "someone-else") is None
    asyncio.run(go())


def test_a_search_reads_completed_files_and_the_revision_moves(open_store):
    async def go():
        store = _store(open_store)
        await _make(store, files=("file-a", "file-b"))
        now = time.time()
        start = await store.revision("vs_1")
        for _ in range(2):
            row = await store.claim_file("A", now + 30, now)
            key = (row["store_id"], row["file_id"])
            assert await store.add_chunks(key, "A", now + 30,
                                          [(0, "zero", _vec(1, 0)), (1, "one", _vec(0, 1))])
            if row["file_id"] == "file-a":
                assert await store.finish_file(key, "A", "completed", 2, None)
        revision, files, rows = await store.vectors("vs_1")
        assert revision == start + 1
        assert [f["file_id"] for f in files] == ["file-a"]    # file-b is still in progress
        assert files[0]["attributes"] == {"k": "file-a"}
        assert sorted((i, s) for i, s, _ in rows) == [(0, 0), (0, 1)]
        assert await store.texts("vs_1", [("file-a", 1)]) == {("file-a", 1): "one"}
        assert await store.set_attributes("vs_1", "file-a", "o", {"k": 2})
        assert await store.revision("vs_1") == start + 2
        await store.add_files([_file("vs_1", "file-a")])      # attached again: starts over
        assert (await store.vectors("vs_1"))[1] == []
        assert await store.file_chunks("vs_1", "file-a", 10) == []
    asyncio.run(go())


def test_pages_by_id_both_ways(open_store):
    async def go():
        store = _store(open_store)
        for i in range(5):
            await _make(store, f"vs_{i}")
        rows, more = await store.page("o", None, None, 2, "desc")
        assert [r["id"] for r in rows] == ["vs_4", "vs_3"] and more
        rows, more = await store.page("o", "vs_3", None, 10, "desc")
        assert [r["id"] for r in rows] == ["vs_2", "vs_1", "vs_0"] and not more
        rows, more = await store.page("o", "vs_1", "vs_4", 10, "asc")
        assert [r["id"] for r in rows] == ["vs_2", "vs_3"]
    asyncio.run(go())


def test_an_expired_store_is_emptied_and_stays_expired(open_store):
    """Once its expiry passes, a store's files, chunks and vectors go (a sweep of every
    expired store, or one store as it is read), its batches are cancelled, its files are no
    longer claimed for ingestion, and activity no longer moves its expiry."""
    async def go():
        store = _store(open_store)
        await _make(store, "vs_1", files=("file-a",))
        await _make(store, "vs_2", files=("file-c",))
        now = time.time()
        a = await store.claim_file("A", now + 30, now)
        key = (a["store_id"], a["file_id"])
        assert await store.add_chunks(key, "A", now + 30, [(0, "zero", _vec(1, 0))])
        assert await store.finish_file(key, "A", "completed", 12, None)
        await store.add_files([_file(key[0], "file-b", batch_id="vsfb_1")],
                              dict(id="vsfb_1", store_id=key[0], owner="o",
                                   status="in_progress", created_at=int(now)))
        other = "vs_2" if key[0] == "vs_1" else "vs_1"
        for store_id in ("vs_1", "vs_2"):
            await store.update(store_id, "o", {"expires_days": 1, "expires_at": int(now) - 1})
        revision = await store.revision(key[0])
        assert await store.claim_file("B", now + 30, now) is None   # expired: not ingested
        await store.touch(key[0], int(now))
        assert (await store.get(key[0], "o"))["expires_at"] == int(now) - 1
        assert await store.expire(other, now)                 # one store, as it is read
        assert sorted(await store.sweep(now)) == [key[0]]     # the rest, swept
        assert await store.sweep(now) == [] and not await store.expire(key[0], now)
        stats = await store.stats(["vs_1", "vs_2"])
        assert stats == {"vs_1": ({}, 0), "vs_2": ({}, 0)}
        assert await store.file_chunks(*key, 10) == []
        assert (await store.vectors(key[0]))[1:] == ([], [])
        assert await store.revision(key[0]) == revision + 1
        row, counts = await store.get_batch(key[0], "vsfb_1", "o")
        assert row["status"] == "cancelled" and counts == {}
        assert await store.get(key[0], "o") is not None       # the store itself stays
    asyncio.run(go())
