"""What replicas sharing one database need from the store, on SQLite and PostgreSQL: leases
(renewed by their holder, lapsed ones failed once, by one replica), cancel requests carried
to the replica running a response, finished responses that late writes cannot change, and
(PostgreSQL) writes and cancels heard at once by every replica's listener."""

import asyncio
import time

from podium.api.responses.log import fail_response
from podium.store.sql import SQLStore
from tests.store.test_sql import A, event, record

LEASE = 30.0


def running(store, rid, replica="replica_a", until=None):
    asyncio.run(store.put(record(rid, status="in_progress"),
                          (replica, time.time() + LEASE if until is None else until)))


def test_a_held_lease_keeps_a_response_running(open_store):
    store = open_store()
    running(store, "resp_held")
    assert asyncio.run(store.fail_unfinished("stopped", fail_response)) == []
    cancel, lost = asyncio.run(store.renew(["resp_held"], "replica_a", time.time() + LEASE))
    assert cancel == set() and lost == set()
    assert asyncio.run(store.get("resp_held", A)).status == "in_progress"


def test_a_lapsed_lease_is_failed_once_with_its_log_closed(open_store):
    first, second = open_store(), open_store()          # two replicas
    running(first, "resp_dead", until=time.time() - 1)
    running(first, "resp_alive")
    asyncio.run(first.append_events("resp_dead", [event(0, "response.created"),
                                                  event(1, "response.in_progress")]))
    assert asyncio.run(second.fail_unfinished("its replica died", fail_response)) == ["resp_dead"]
    assert asyncio.run(first.fail_unfinished("its replica died", fail_response)) == []  # done
    body = asyncio.run(first.get("resp_dead", A)).body
    assert body["status"] == "failed" and body["error"]["message"] == "its replica died"
    assert asyncio.run(first.events_after("resp_dead", 1))[-1]["type"] == "response.failed"
    assert asyncio.run(first.get("resp_alive", A)).status == "in_progress"


def test_renewing_extends_only_the_holders_running_responses(open_store):
    store = open_store()
    running(store, "resp_mine", until=time.time() + 1)
    running(store, "resp_theirs", replica="replica_b", until=time.time() + 1)
    cancel, lost = asyncio.run(store.renew(["resp_mine", "resp_theirs"], "replica_a",
                                           time.time() + LEASE))
    assert lost == {"resp_theirs"} and cancel == set()
    later = time.time() + 2
    assert asyncio.run(store.fail_unfinished("lapsed", fail_response, now=later)) == ["resp_theirs"]


def test_a_response_failed_elsewhere_is_lost_to_its_holder_and_stays_failed(open_store):
    store = open_store()
    running(store, "resp_slow", until=time.time() - 1)        # its holder missed a renewal
    asyncio.run(store.fail_unfinished("lapsed", fail_response))
    cancel, lost = asyncio.run(store.renew(["resp_slow"], "replica_a", time.time() + LEASE))
    assert lost == {"resp_slow"}
    # the holder's late writes change nothing: no events, no status
    late = [event(50, "response.output_text.delta")]
    assert asyncio.run(store.append_events("resp_slow", late)) is False
    asyncio.run(store.update("resp_slow", {"id": "resp_slow", "status": "completed"}))
    assert asyncio.run(store.get("resp_slow", A)).status == "failed"


def test_a_cancel_request_reaches_the_holder_at_its_renewal(open_store):
    holder, other = open_store(), open_store()
    running(holder, "resp_bg")
    assert asyncio.run(other.request_cancel("resp_bg", "key_other")) is False   # not theirs
    assert asyncio.run(other.request_cancel("resp_bg", A)) is True
    cancel, lost = asyncio.run(holder.renew(["resp_bg"], "replica_a", time.time() + LEASE))
    assert cancel == {"resp_bg"} and lost == set()
    asyncio.run(holder.update("resp_bg", {"id": "resp_bg", "status": "cancelled"}))
    assert asyncio.run(other.request_cancel("resp_bg", A)) is False            # finished


def test_giving_a_lease_up_lets_the_next_pass_fail_it_at_once(open_store):
    store = open_store()
    running(store, "resp_left")
    asyncio.run(store.renew(["resp_left"], "replica_a", 0))
    assert asyncio.run(store.fail_unfinished("left at shutdown", fail_response)) == ["resp_left"]


# -- PostgreSQL: LISTEN / NOTIFY ---------------------------------------------------------

def test_postgres_a_write_on_one_replica_wakes_a_waiter_on_another(pg_url):
    writer, follower = SQLStore(pg_url), SQLStore(pg_url)
    heard: list[str] = []

    async def scenario() -> list[float]:
        await follower.start(heard.append)
        delays = []
        try:
            await writer.put(record("resp_live", status="in_progress"),
                             ("replica_a", time.time() + LEASE))
            for seq in range(5):
                changed = follower.changed("resp_live")
                started = time.monotonic()
                await writer.append_events("resp_live", [event(seq)])
                await asyncio.wait_for(changed.wait(), 5)
                delays.append(time.monotonic() - started)
            assert await writer.request_cancel("resp_live", A)
            for _ in range(100):
                if heard:
                    break
                await asyncio.sleep(0.01)
        finally:
            await follower.aclose()
            await writer.aclose()
        return delays

    delays = asyncio.run(scenario())
    assert heard == ["resp_live"]
    assert max(delays) < 0.5, delays         # heard, not found by a poll (there is none)


def test_postgres_the_listener_reconnects(pg_url):
    import psycopg

    store, other = SQLStore(pg_url), SQLStore(pg_url)

    async def scenario() -> None:
        await store.start(lambda _: None)
        try:
            # end every other session's listening connection, as a database restart would
            with psycopg.connect(pg_url.split("?")[0], autocommit=True) as admin:
                admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                              "WHERE query LIKE 'LISTEN%' AND pid <> pg_backend_pid()")
            await asyncio.sleep(0.2)
            assert store.listener.connected is not None
            await asyncio.wait_for(store.listener.connected.wait(), 10)
            await other.put(record("resp_after", status="in_progress"),
                            ("replica_a", time.time() + LEASE))
            changed = store.changed("resp_after")
            await other.append_events("resp_after", [event(0)])
            await asyncio.wait_for(changed.wait(), 5)
        finally:
            await store.aclose()
            await other.aclose()

    asyncio.run(scenario())


def test_a_delete_tells_the_holder_to_stop(open_store):
    store = open_store()
    for i in range(3):
        running(store, f"resp_{i}")
    asyncio.run(store.delete("resp_1", A))
    cancel, lost = asyncio.run(store.renew([f"resp_{i}" for i in range(3)], "replica_a",
                                           time.time() + LEASE))
    assert lost == {"resp_1"} and cancel == set()
