"""The batch worker: every replica runs one, and any of them does any batch's work.

Its loop, about once a second (at once when something here changes):

- **Steps** one replica does alone, each under the batch's lease (``BatchStore.claim_batch``):
  reading a ``validating`` batch's input file line by line (``read_line``: a line that breaks
  the format fails the batch with line-numbered ``errors``; otherwise every line becomes a
  queued request row, and the batch ``in_progress``), and writing the output and error files
  of a batch whose requests are all answered (``finalizing``, then ``completed``), which is
  past its window (``expired``: the requests not run are ``batch_expired`` lines in the error
  file) or cancelled (``cancelled``: ``batch_cancelled`` lines). A replica that dies in a
  step leaves its lease to lapse, and another begins the step again.
- **Requests**: up to ``--batch-max-in-flight`` at once, claimed with leases
  (``claim_requests``) among the batches whose model this replica serves (replicas on one
  database may serve different models, or answer to different aliases: a batch for a model
  no replica serves waits until its window ends, and then expires; validation fails it only
  for a model served here of another kind), each run by the endpoint's own service
  (``execute``, given by the server) at ``BATCH_PRIORITY`` in the engine, below every
  interactive request, and its output line written once (``finish_request``). Leases are
  renewed every third of ``--response-lease-seconds``; a request whose lease lapsed (its
  replica died) is claimed again, here or elsewhere. A request refused for want of room
  (429, or 503 while its model waits to load) goes back to the queue for a few seconds
  instead of failing.
- **Cancels and windows**: the statuses of the batches it runs are read each turn; a batch
  cancelled (on any replica) or past its window has its running requests stopped and given
  back, for the step that ends it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import secrets
import time
from dataclasses import dataclass
from typing import Any, AsyncIterator, Awaitable, Callable

import orjson

from podium.errors import ModelNotFound, PodiumError, StoreUnavailable
from podium.protocol.batches import (MAX_ERRORS, MAX_REQUESTS, LineError, error_line,
                                     output_line, read_line)
from podium.store.batches import BatchStore, Claimed, Usage
from podium.store.files import CHUNK_BYTES, FileStore, StoredFile, id_time, new_id

log = logging.getLogger(__name__)
Obj = dict[str, Any]

BATCH_PRIORITY = -1             # below interactive requests (0) in every engine's queue
POLL_SECONDS = 1.0              # the loop's turn when nothing here wakes it
RETRY_SECONDS = 2.0             # a request refused for want of room waits this long
_PAGE = 32                      # request rows (their answers) a finalizing step reads
_ROWS, _ROWS_BYTES = 500, 4 << 20   # request rows a validating step writes at a time
_UNRUN = {"expired": ("batch_expired", "This request could not be executed before the "
                      "completion window expired."),
          "cancelled": ("batch_cancelled", "This request was not executed because the "
                        "batch was cancelled.")}


@dataclass
class Outcome:
    """What running one request gave: the HTTP status and body its endpoint would have
    answered, its usage, and whether it was refused for want of room (try again later)."""
    status: int
    body: Obj
    usage: Usage
    retry: bool = False


Execute = Callable[[str, Obj, str], Awaitable[Outcome]]      # endpoint, body, owner
CheckModel = Callable[[str, str], None]                      # model, endpoint: raises


def _id(prefix: str) -> str:
    return prefix + secrets.token_hex(12)


class _FileWriter:
    """An output or error file written a chunk at a time; never made when nothing is
    written."""

    def __init__(self, files: FileStore, owner: str, filename: str, expires: int | None):
        self.files, self.owner, self.filename, self.expires = files, owner, filename, expires
        self.id = new_id()
        self.pending = bytearray()
        self.size = 0
        self.seq = 0

    async def write(self, line: bytes) -> None:
        self.pending += line
        self.size += len(line)
        while len(self.pending) >= CHUNK_BYTES:
            await self.files.write_chunk(self.id, self.owner, self.seq,
                                         bytes(self.pending[:CHUNK_BYTES]))
            del self.pending[:CHUNK_BYTES]
            self.seq += 1

    async def close(self) -> str | None:
        if not self.size:
            return None
        created = (id_time(self.id) or 0) // 1000
        await self.files.finish(self.id, self.owner, self.seq, bytes(self.pending), StoredFile(
            self.id, "batch_output", self.filename, self.size, created,
            None if self.expires is None else created + self.expires))
        return self.id


class Worker:
    def __init__(self, store: BatchStore, files: FileStore, *, execute: Execute,
                 check_model: CheckModel, in_flight: int, lease_seconds: float,
                 max_line_bytes: int, on_result: Callable[[bool], None] | None = None):
        self._store, self._files = store, files
        self._execute, self._check_model = execute, check_model
        self.in_flight = max(1, in_flight)
        self.lease = lease_seconds
        self._max_line = max_line_bytes
        self._on_result = on_result or (lambda error: None)
        self.replica = secrets.token_hex(8)
        self._running: dict[tuple[str, int], asyncio.Task] = {}
        self._writing: set[tuple[str, int]] = set()     # requests writing their answer
        self._step: asyncio.Task | None = None
        self._loop_task: asyncio.Task | None = None
        self._wake = asyncio.Event()
        self._renewed = 0.0

    def poke(self) -> None:
        """Something here changed (a batch made or cancelled, a request done): look now."""
        self._wake.set()

    async def start(self) -> None:
        self._loop_task = asyncio.create_task(self._loop(), name="podium-batches")

    async def stop(self) -> None:
        """Stop running: the requests held here go back to the queue (another replica, or
        this one restarted, runs them), a step in progress is left to its lease."""
        held = list(self._running)          # (a cancelled request leaves _running)
        tasks = [t for t in (self._loop_task, self._step) if t is not None]
        tasks += self._running.values()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._running.clear()
        if held:
            with contextlib.suppress(StoreUnavailable):
                await self._store.release(held, self.replica)

    # -- the loop -----------------------------------------------------------------------

    async def _loop(self) -> None:
        while True:
            try:
                await self._turn()
            except StoreUnavailable as exc:
                log.warning("batches: %s", exc.message)
            except Exception:  # noqa: BLE001 - the worker must outlive any one failure
                log.exception("batches: a turn of the worker failed")
            self._wake.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), POLL_SECONDS)

    async def _turn(self) -> None:
        now = time.time()
        if self._running:
            if now - self._renewed >= self.lease / 3:
                lost = await self._store.renew_requests(list(self._running), self.replica,
                                                        now + self.lease)
                self._renewed = now
                for key in lost:                # another replica has it now: stop ours
                    self._stop(key)
            statuses = await self._store.statuses(sorted({k[0] for k in self._running}))
            ended = [key for key in self._running if key not in self._writing and (
                     statuses.get(key[0], ("gone", 0))[0] != "in_progress"
                     or statuses[key[0]][1] <= now)]
            for key in ended:
                self._stop(key)
            if ended:
                await self._store.release(ended, self.replica)
        if self._step is None or self._step.done():
            row = await self._store.claim_batch(self.replica, now + self.lease, now)
            if row is not None:
                self._step = asyncio.create_task(self._do_step(row),
                                                 name=f"podium-batch-{row['id']}")
        free = self.in_flight - len(self._running)
        if free > 0:
            served = await self._served(now)
            for claimed in await self._store.claim_requests(self.replica, now + self.lease,
                                                            now, free, served):
                if not self._running:
                    self._renewed = now
                self._running[claimed.key] = asyncio.create_task(
                    self._run(claimed), name=f"podium-batch-request-{claimed.line}")

    async def _served(self, now: float) -> set[str]:
        """The models of the running batches that this replica serves, as the batches name
        them: replicas on one database may serve different models (and aliases, globs
        among them), and each claims only requests it can run."""
        return {model for model, endpoint in await self._store.running_models(now)
                if self._serves(model, endpoint)}

    def _serves(self, model: str, endpoint: str) -> bool:
        """Whether a name is one of this replica's models: one it knows but of another
        kind is still its own to answer (each line a 400, as the route would answer)."""
        try:
            self._check_model(model, endpoint)
        except ModelNotFound:
            return False
        except PodiumError:
            pass
        return True

    def _stop(self, key: tuple[str, int]) -> None:
        """Stop a request running here, unless its answer is being written (the write
        lands, or is refused if the request is no longer ours, and either way is counted
        right: a request stopped after its write committed would never be counted here)."""
        if key in self._writing:
            return
        task = self._running.pop(key, None)
        if task is not None:
            task.cancel()

    # -- requests -----------------------------------------------------------------------

    async def _run(self, claimed: Claimed) -> None:
        key = claimed.key
        try:
            try:
                outcome = await self._execute(claimed.endpoint, orjson.loads(claimed.body),
                                              claimed.owner)
            except PodiumError as exc:
                outcome = Outcome(exc.status_code, exc.to_body(), Usage())
            if outcome.retry:
                await self._store.release([key], self.replica, time.time() + RETRY_SECONDS)
                return
            line = output_line(_id("batch_req_"), claimed.custom_id, outcome.status,
                               _id("req_"), outcome.body)
            error = outcome.status != 200
            self._writing.add(key)      # not stopped now: its write is counted where it lands
            if await self._store.finish_request(key, self.replica, orjson.dumps(line).decode(),
                                                error, outcome.usage):
                self._on_result(error)
        except StoreUnavailable as exc:     # its lease lapses and it runs again
            log.warning("batch %s line %d: not written: %s", claimed.batch_id, claimed.line,
                        exc.message)
        except Exception:  # noqa: BLE001 - one request must not stop the others
            log.exception("batch %s line %d failed", claimed.batch_id, claimed.line)
        finally:
            self._writing.discard(key)
            if self._running.get(key) is asyncio.current_task():
                del self._running[key]
            self.poke()

    # -- steps --------------------------------------------------------------------------

    async def _do_step(self, row: Obj) -> None:
        status, now = row["status"], time.time()
        try:
            if status == "validating":
                await self._validate(row)
            elif status == "cancelling":
                await self._finalize(row, "cancelled")
            elif status == "in_progress" and row["expires_at"] <= now:
                await self._finalize(row, "expired")
            else:                               # every request answered (or finalizing)
                await self._finalize(row, "completed")
        except StoreUnavailable as exc:         # the lease lapses: the step begins again
            log.warning("batch %s: %s", row["id"], exc.message)
        except _LeaseLost:
            log.warning("batch %s: its %s step was taken over by another replica",
                        row["id"], status)
        except Exception:  # noqa: BLE001
            log.exception("batch %s: its %s step failed", row["id"], status)
        finally:
            self.poke()

    async def _keep(self, batch_id: str, renewed: list[float]) -> None:
        """Renew a step's lease when a third of it has passed; LeaseLost if it was lost."""
        now = time.time()
        if now - renewed[0] >= self.lease / 3:
            if not await self._store.renew_batch(batch_id, self.replica, now + self.lease):
                raise _LeaseLost(batch_id)
            renewed[0] = now

    async def _lines(self, found: StoredFile) -> AsyncIterator[tuple[int, bytes | None]]:
        """The file's lines (numbered from 1; blank ones skipped), read a chunk at a time;
        None for a line longer than ``max_line_bytes`` (not kept)."""
        buffer, number, skipping, seq, read = bytearray(), 0, False, 0, 0
        while read < found.bytes:
            data = await self._files.chunk(found.id, seq)
            if data is None:
                raise _FileGone(found.id)
            seq, read = seq + 1, read + len(data)
            start = 0
            while True:
                end = data.find(b"\n", start)
                piece = data[start:] if end < 0 else data[start:end]
                if not skipping:
                    buffer += piece
                    if len(buffer) > self._max_line:
                        buffer.clear()
                        skipping = True
                if end < 0:
                    break
                number += 1
                if skipping:
                    yield number, None
                elif buffer.strip():
                    yield number, bytes(buffer)
                buffer.clear()
                skipping, start = False, end + 1
        if skipping or buffer.strip():
            yield number + 1, None if skipping else bytes(buffer)

    async def _validate(self, row: Obj) -> None:
        batch_id, endpoint = row["id"], row["endpoint"]
        renewed = [time.time()]
        await self._store.clear_requests(batch_id)  # a validation begun before, elsewhere
        found = await self._files.get(row["input_file_id"], row["owner"], time.time())
        errors: list[LineError] = []
        seen: set[bytes] = set()                # custom_ids' digests (16 bytes each)
        held = 0                                # bytes of the rows not written yet
        model: str | None = None
        rows: list[tuple[int, str, str]] = []
        count = 0
        try:
            if found is None:
                raise _FileGone(row["input_file_id"])
            async for number, text in self._lines(found):
                count += 1
                if count > MAX_REQUESTS:
                    errors.append(LineError("too_many_requests", f"A batch holds at most "
                                            f"{MAX_REQUESTS} requests.", number))
                    break
                try:
                    if text is None:
                        raise LineError("line_too_long", f"Line {number} is longer than "
                                        f"{self._max_line} bytes.", number)
                    custom_id, body, named = read_line(text, number, endpoint)
                    if named is None:
                        raise LineError("missing_model", f"Line {number}'s body names no "
                                        "model.", number, "body.model")
                    if model is not None and named != model:
                        raise LineError("mismatched_model",
                                        f"Line {number}'s model {named!r:.80} is not the "
                                        f"batch's {model!r}: a batch uses one model.", number,
                                        "body.model")
                    model = named
                    digest = hashlib.blake2b(custom_id.encode(), digest_size=16).digest()
                    if digest in seen:
                        raise LineError("duplicate_custom_id", f"Line {number}'s custom_id "
                                        f"{custom_id!r:.80} is used by an earlier line.",
                                        number, "custom_id")
                    seen.add(digest)
                except LineError as exc:
                    errors.append(exc)
                    if len(errors) >= MAX_ERRORS:
                        break
                    continue
                if not errors:
                    rows.append((number, custom_id, orjson.dumps(body).decode()))
                    held += len(rows[-1][2])
                    if held >= _ROWS_BYTES or len(rows) >= _ROWS:
                        await self._store.add_requests(batch_id, rows)
                        rows, held = [], 0
                await self._keep(batch_id, renewed)
        except _FileGone:
            errors = [LineError("invalid_file", "The input file was deleted before the batch "
                                "read it.", None, "input_file_id")]
        if not errors and count == 0:
            errors = [LineError("empty_file", "The input file has no requests.", None,
                                "input_file_id")]
        if not errors and model is not None:
            errors = self._model_errors(batch_id, model, endpoint)
        now = int(time.time())
        if errors:
            body = {"object": "list", "data": [e.to_obj() for e in errors]}
            if await self._store.step(batch_id, self.replica, "validating", {
                    "status": "failed", "failed_at": now, "model": model,
                    "errors": orjson.dumps(body).decode()}, drop_requests=True):
                log.info("batch %s: validating -> failed (%d errors, first: %s)", batch_id,
                         len(errors), errors[0].message)
            else:
                await self._after_validating(batch_id, model)
            return
        if rows:
            await self._store.add_requests(batch_id, rows)
        if await self._store.step(batch_id, self.replica, "validating", {
                "status": "in_progress", "in_progress_at": now, "total": count,
                "model": model}):
            log.info("batch %s: validating -> in_progress (%d requests, model %s)", batch_id,
                     count, model)
        else:
            await self._after_validating(batch_id, model)

    def _model_errors(self, batch_id: str, model: str, endpoint: str) -> list[LineError]:
        """A model this replica serves but of another kind fails the batch; one it does not
        serve may be another replica's (replicas on one database may serve different
        models): its requests wait for one that serves it, until the batch's window ends."""
        try:
            self._check_model(model, endpoint)
        except ModelNotFound:
            log.info("batch %s: model %r is not served here: its requests wait for a "
                     "replica that serves it", batch_id, model)
        except PodiumError as exc:
            return [LineError("invalid_model", exc.message, None, "body.model")]
        return []

    async def _after_validating(self, batch_id: str, model: str | None) -> None:
        """The batch left ``validating`` while it was read (cancelled): let its step go,
        for the cancelling step."""
        await self._store.step(batch_id, self.replica, None, {"model": model})

    async def _finalize(self, row: Obj, final: str) -> None:
        """Write the output and error files, then end the batch ``final``."""
        batch_id, owner, was = row["id"], row["owner"], row["status"]
        renewed = [time.time()]
        if final == "completed" and was == "in_progress":
            if not await self._store.step(batch_id, self.replica, "in_progress", {
                    "status": "finalizing", "finalizing_at": int(time.time())},
                    release=False):
                return
            log.info("batch %s: in_progress -> finalizing", batch_id)
            was = "finalizing"
        ran = row["in_progress_at"] is not None
        await self._store.close_open(batch_id, self.replica, count_failed=ran)
        unrun = _UNRUN.get(final) if ran else None
        expires = row["output_expires"]
        out = _FileWriter(self._files, owner, f"{batch_id}_output.jsonl", expires)
        err = _FileWriter(self._files, owner, f"{batch_id}_error.jsonl", expires)
        after = 0
        while page := await self._store.results(batch_id, after, _PAGE):
            for r in page:
                if r["state"] == "done":
                    await (err if r["error"] else out).write(r["result"].encode() + b"\n")
                elif unrun is not None:
                    await err.write(orjson.dumps(error_line(
                        _id("batch_req_"), r["custom_id"], *unrun)) + b"\n")
            after = page[-1]["line"]
            await self._keep(batch_id, renewed)
        output_id, error_id = await out.close(), await err.close()
        if await self._store.step(batch_id, self.replica, was, {
                "status": final, f"{final}_at": int(time.time()),
                "output_file_id": output_id, "error_file_id": error_id},
                drop_requests=True):
            log.info("batch %s: %s -> %s (output %s, errors %s)", batch_id, was, final,
                     output_id, error_id)
        else:                                   # lost (a long pause): the files go
            for file_id in (output_id, error_id):
                if file_id is not None:
                    await self._files.discard(file_id)


class _LeaseLost(Exception):
    pass


class _FileGone(Exception):
    pass
