"""BatchStore on SQLite and PostgreSQL: two replicas' claims (each of the models it serves),
lapsed leases, a result written once, and how a batch's step is held."""

from __future__ import annotations

import asyncio
import time

import sqlalchemy as sa

from podium.store.batches import BatchStore, Usage, batches


def _store(open_store) -> BatchStore:
    return BatchStore(open_store().engine)


MODEL = "m"


async def _running_batch(store: BatchStore, n: int, batch_id: str = "batch_1",
                         model: str = MODEL) -> None:
    now = int(time.time())
    await store.create(dict(id=batch_id, owner="o", status="validating",
                            endpoint="/v1/chat/completions", input_file_id="file-x",
                            completion_window="24h", created_at=now, expires_at=now + 86400))
    assert (await store.claim_batch("A", time.time() + 30, time.time()))["id"] == batch_id
    await store.add_requests(batch_id, [(i + 1, f"c{i}", "{}") for i in range(n)])
    assert await store.step(batch_id, "A", "validating", {"status": "in_progress",
                                                           "in_progress_at": now, "total": n,
                                                           "model": model})


def test_two_replicas_never_claim_one_request(open_store):
    async def go():
        store = _store(open_store)
        await _running_batch(store, 10)
        now = time.time()
        a, b = await asyncio.gather(store.claim_requests("A", now + 30, now, 6, [MODEL]),
                                    store.claim_requests("B", now + 30, now, 6, [MODEL]))
        lines = [c.line for c in a + b]
        assert sorted(lines) == list(range(1, 11))        # each once, all of them
        assert await store.claim_requests("C", now + 30, now, 5, [MODEL]) == []
    asyncio.run(go())


def test_a_lapsed_lease_is_claimed_again_and_the_late_answer_refused(open_store):
    async def go():
        store = _store(open_store)
        await _running_batch(store, 2)
        now = time.time()
        (first, second) = await store.claim_requests("A", now + 0.2, now, 2, [MODEL])
        assert first.line == 1 and first.custom_id == "c0" and first.owner == "o"
        assert await store.renew_requests([first.key], "A", now + 30) == set()
        later = now + 1                                   # A's lease on line 2 lapsed
        (again,) = await store.claim_requests("B", later + 30, later, 5, [MODEL])
        assert again.key == second.key
        assert await store.renew_requests([second.key], "A", later + 30) == {second.key}
        assert not await store.finish_request(second.key, "A", "late", False, Usage(5))
        assert await store.finish_request(second.key, "B", "won", False, Usage(7, 1, 3))
        assert not await store.finish_request(second.key, "B", "twice", False, Usage(7))
        row = await store.get("batch_1", "o")
        assert (row["completed"], row["failed"], row["input_tokens"],
                row["cached_tokens"], row["output_tokens"]) == (1, 0, 7, 1, 3)
        assert [r["result"] for r in await store.results("batch_1", 0, 10)] == [None, "won"]
    asyncio.run(go())


def test_released_requests_wait_for_their_retry_time(open_store):
    async def go():
        store = _store(open_store)
        await _running_batch(store, 1)
        now = time.time()
        (claimed,) = await store.claim_requests("A", now + 30, now, 1, [MODEL])
        await store.release([claimed.key], "A", now + 5)
        assert await store.claim_requests("A", now + 30, now + 1, 1, [MODEL]) == []
        again = await store.claim_requests("A", now + 40, now + 6, 1, [MODEL])
        assert [c.key for c in again] == [claimed.key]
    asyncio.run(go())


def test_a_step_is_held_by_one_replica_until_its_lease_lapses(open_store):
    async def go():
        store = _store(open_store)
        now = int(time.time())
        await store.create(dict(id="batch_2", owner="o", status="validating",
                                endpoint="/v1/embeddings", input_file_id="file-x",
                                completion_window="24h", created_at=now,
                                expires_at=now + 86400))
        t = time.time()
        assert (await store.claim_batch("A", t + 0.5, t))["id"] == "batch_2"
        assert await store.claim_batch("B", t + 30, t) is None
        assert await store.renew_batch("batch_2", "A", t + 0.5)
        assert (await store.claim_batch("B", t + 30, t + 1))["id"] == "batch_2"  # lapsed
        assert not await store.renew_batch("batch_2", "A", t + 40)
        assert not await store.step("batch_2", "A", "validating", {"status": "failed"})
        assert await store.step("batch_2", "B", "validating", {"status": "failed"})
        assert (await store.get("batch_2", None))["status"] == "failed"
        assert await store.get("batch_2", "someone else") is None
    asyncio.run(go())


def test_closing_counts_unanswered_requests_once(open_store):
    async def go():
        store = _store(open_store)
        await _running_batch(store, 3)
        now = time.time()
        (c1, *_) = await store.claim_requests("A", now + 30, now, 3, [MODEL])
        assert await store.finish_request(c1.key, "A", "{}", False, Usage())
        await store.cancel("batch_1", "o", int(now))
        await store.release([(c1.batch_id, 2), (c1.batch_id, 3)], "A")
        assert (await store.claim_batch("A", now + 30, now))["status"] == "cancelling"
        assert await store.close_open("batch_1", "A", count_failed=True) == 2
        assert await store.close_open("batch_1", "A", count_failed=True) == 0   # again
        row = await store.get("batch_1", "o")
        assert (row["completed"], row["failed"]) == (1, 2)
        assert await store.claim_requests("B", now + 30, now, 3, [MODEL]) == []
    asyncio.run(go())


def test_a_replica_claims_only_requests_of_models_it_serves(open_store):
    """Replicas on one database serving different models: each claims its own model's
    requests, lapsed ones included; a model none serves is left queued."""
    async def go():
        store = _store(open_store)
        await _running_batch(store, 3, "batch_a", model="alpha")
        await _running_batch(store, 2, "batch_b", model="beta")
        await _running_batch(store, 2, "batch_c", model="gamma")
        now = time.time()
        assert sorted(await store.running_models(now)) == [
            ("alpha", "/v1/chat/completions"), ("beta", "/v1/chat/completions"),
            ("gamma", "/v1/chat/completions")]
        a = await store.claim_requests("A", now + 0.5, now, 10, ["alpha", "delta"])
        b = await store.claim_requests("B", now + 30, now, 10, {"beta"})
        assert [c.key for c in a] == [("batch_a", i) for i in (1, 2, 3)]
        assert [c.key for c in b] == [("batch_b", 1), ("batch_b", 2)]
        assert await store.claim_requests("C", now + 30, now, 10, []) == []
        later = now + 1                                   # A died: its leases lapsed
        assert await store.claim_requests("B", later + 30, later, 10, ["beta"]) == []
        again = await store.claim_requests("A2", later + 30, later, 10, ["alpha"])
        assert [c.key for c in again] == [c.key for c in a]
        rows = await store.results("batch_c", 0, 10)
        assert [r["state"] for r in rows] == ["queued", "queued"]
        # a batch past its window is no running batch: its model is not asked about
        with store.engine.begin() as db:
            db.execute(sa.update(batches).where(batches.c.id == "batch_c").values(
                expires_at=int(now) - 1))
        assert ("gamma", "/v1/chat/completions") not in await store.running_models(now)
    asyncio.run(go())
