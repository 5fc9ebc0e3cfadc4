"""The Files API (``/v1/files``) through the official openai SDK (``client.files``) and raw
httpx, against Podium served over HTTP (uvicorn in a thread, scripted engine), on SQLite and
on PostgreSQL (``tests/store/conftest.py``: skipped, one line each, when none is running)."""

from __future__ import annotations

import hashlib
import socket
import threading
import time

import httpx
import openai
import pytest
import sqlalchemy as sa

from podium.engine.base import ModelInfo
from podium.engine.scripted import ScriptedEngine
from podium.settings import Settings
from podium.store.files import CHUNK_BYTES, file_chunks, files
from tests.conftest import SERVED
from tests.server.test_conversations import Served
from tests.store.conftest import postgres_url

MiB = 1 << 20


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request, tmp_path):
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'files.db'}"
    else:
        yield from postgres_url()


@pytest.fixture
def serve(tokenizer, db_url):
    servers: list[Served] = []

    def build(**settings) -> Served:
        engine = ScriptedEngine(tokenizer, ModelInfo(SERVED, 4096, "", 0), ["Hi."])
        settings.setdefault("store_url", db_url)
        served = Served(engine, Settings(**settings))
        servers.append(served)
        return served
    yield build
    for served in servers:
        served.stop()


def url(served: Served) -> str:
    return f"http://127.0.0.1:{served.port}/v1/files"


def rows(served: Served) -> tuple[int, int]:
    """(file rows, chunk rows) in the database, uploads in progress included."""
    engine = served.app.state.files._store.engine
    with engine.connect() as db:
        return (db.execute(sa.select(sa.func.count()).select_from(files)).scalar(),
                db.execute(sa.select(sa.func.count()).select_from(file_chunks)).scalar())


def jsonl(lines: int) -> bytes:
    return b"".join(b'{"custom_id": "r%d", "method": "POST", "url": "/v1/chat/completions", '
                    b'"body": {"model": "m", "messages": []}}\n' % i for i in range(lines))


# -- the SDK ------------------------------------------------------------------------------

def test_sdk_upload_retrieve_content_delete(serve, tmp_path):
    served = serve()
    sdk = served.client()
    data = jsonl(30_000)                     # about 3.4 MiB: four chunk rows
    assert len(data) > 3 * CHUNK_BYTES
    path = tmp_path / "requests.jsonl"
    path.write_bytes(data)
    with path.open("rb") as fh:
        made = sdk.files.create(file=fh, purpose="batch")
    assert made.id.startswith("file-") and made.object == "file"
    assert (made.bytes, made.filename, made.purpose, made.status) == (
        len(data), "requests.jsonl", "batch", "processed")
    assert abs(made.created_at - time.time()) < 5
    assert made.expires_at == made.created_at + 30 * 86400      # batch files: 30 days
    assert rows(served) == (1, 4)
    assert sdk.files.retrieve(made.id).model_dump() == made.model_dump()
    assert sdk.files.content(made.id).content == data
    with sdk.files.with_streaming_response.content(made.id) as response:
        assert response.headers["content-length"] == str(len(data))
        assert hashlib.sha256(b"".join(response.iter_bytes())).digest() == \
            hashlib.sha256(data).digest()
    deleted = sdk.files.delete(made.id)
    assert (deleted.id, deleted.object, deleted.deleted) == (made.id, "file", True)
    assert rows(served) == (0, 0)
    for call in (lambda: sdk.files.retrieve(made.id), lambda: sdk.files.content(made.id),
                 lambda: sdk.files.delete(made.id)):
        with pytest.raises(openai.NotFoundError) as caught:
            call()
        assert caught.value.body["param"] == "id"


def test_sdk_user_data_empty_and_named_files(serve):
    sdk = serve().client()
    made = sdk.files.create(file=("notes é.txt", b"any bytes \xff\x00"), purpose="user_data")
    assert (made.filename, made.bytes, made.expires_at) == ("notes é.txt", 12, None)
    assert sdk.files.content(made.id).content == b"any bytes \xff\x00"
    empty = sdk.files.create(file=("empty.jsonl", b""), purpose="batch")
    assert empty.bytes == 0 and sdk.files.content(empty.id).content == b""
    timed = sdk.files.create(file=("t.jsonl", b"{}\n"), purpose="user_data",
                             expires_after={"anchor": "created_at", "seconds": 3600})
    assert timed.expires_at == timed.created_at + 3600


def test_sdk_list_pages_order_purpose_and_after(serve):
    sdk = serve().client()
    made = [sdk.files.create(file=(f"f{i}.jsonl", b"{}\n"),
                             purpose="batch" if i % 2 else "user_data") for i in range(5)]
    newest_first = [f.id for f in reversed(made)]
    page = sdk.files.list(limit=2)
    assert [f.id for f in page.data] == newest_first[:2] and page.has_more is True
    # the SDK's cursor pagination reads has_more and the last id of each page
    assert [f.id for f in sdk.files.list(limit=2)] == newest_first
    assert [f.id for f in sdk.files.list(limit=2, order="asc")] == [f.id for f in made]
    assert [f.id for f in sdk.files.list(purpose="batch")] == [made[3].id, made[1].id]
    assert list(sdk.files.list(purpose="batch_output")) == []
    # a cursor whose file is gone still says where it was
    sdk.files.delete(made[2].id)
    after = sdk.files.list(after=made[2].id, limit=10)
    assert [f.id for f in after.data] == [made[1].id, made[0].id] and after.has_more is False
    raw = httpx.get(url_of(sdk), params={"limit": 2, "order": "asc"},
                    headers={"authorization": "Bearer x"}).json()
    assert raw["object"] == "list" and raw["has_more"] is True
    assert (raw["first_id"], raw["last_id"]) == (made[0].id, made[1].id)


def url_of(sdk: openai.OpenAI) -> str:
    return str(sdk.base_url).rstrip("/") + "/files"


def test_another_keys_files_are_missing(serve):
    served = serve(api_key=["key-a", "key-b"])
    a, b = served.client("key-a"), served.client("key-b")
    made = a.files.create(file=("a.jsonl", b"{}\n"), purpose="batch")
    for call in (lambda: b.files.retrieve(made.id), lambda: b.files.content(made.id),
                 lambda: b.files.delete(made.id)):
        with pytest.raises(openai.NotFoundError):
            call()
    assert list(b.files.list()) == []
    assert [f.id for f in a.files.list()] == [made.id]
    assert a.files.content(made.id).content == b"{}\n"
    with pytest.raises(openai.AuthenticationError):
        served.client("wrong").files.list()


# -- errors, in OpenAI's shape ------------------------------------------------------------

def post(served: Served, files=None, data=None, **kwargs) -> httpx.Response:
    return httpx.post(url(served), files=files, data=data, timeout=30, **kwargs)


def error(response: httpx.Response, status: int, param: str | None) -> str:
    assert response.status_code == status, response.text
    body = response.json()["error"]
    assert body["type"] == "invalid_request_error" and body["param"] == param
    return body["message"]


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_upload_errors(serve):
    served = serve()
    one = {"file": ("a.jsonl", b"{}\n")}
    assert "purpose" in error(post(served, one, {"purpose": "fine-tune"}), 400, "purpose")
    assert "Missing required parameter: 'purpose'" in error(post(served, one), 400, "purpose")
    field = {"purpose": (None, "batch")}               # multipart, without a file part
    assert "'file'" in error(post(served, field), 400, "file")
    # a 'file' field that is not a file, an empty name, a long one, a control character
    assert "filename" in error(post(served, {**field, "file": (None, "x")}), 400, "file")
    for name in ("", "a" * 252 + ".jsonl"):
        error(post(served, {"file": (name, b"{}\n")}, {"purpose": "batch"}), 400, "file")
    control = httpx.post(url(served), content=b"--xx\r\ncontent-disposition: form-data; "
                         b"name=\"file\"; filename=\"a\x01.jsonl\"\r\n\r\n{}\r\n--xx--\r\n",
                         headers={"content-type": "multipart/form-data; boundary=xx"})
    assert "control characters" in error(control, 400, "file")
    # what OpenAI checks of a batch file at upload: the name, and that it is UTF-8
    assert error(post(served, {"file": ("a.txt", b"{}\n")}, {"purpose": "batch"}), 400,
                 "file") == "Invalid file format for Batch API. Must be .jsonl"
    assert error(post(served, {"file": ("a.jsonl", b"{}\n\xff\n")}, {"purpose": "batch"}),
                 400, "file") == "Invalid file for Batch API. Must be utf-8 encoded"
    # UTF-8 checked across chunk boundaries: a character split between two chunks is fine
    split = b"a" * (CHUNK_BYTES - 1) + "é".encode() + b"\n"
    assert post(served, {"file": ("s.jsonl", split)}, {"purpose": "batch"}).status_code == 200
    assert "multipart/form-data" in error(
        httpx.post(url(served), json={"purpose": "batch"}), 400, None)
    error(post(served, one, {"purpose": "batch", "extra": "1"}), 400, "extra")
    error(post(served, {"file": ("a.jsonl", b"{}\n")}, {"purpose": "batch" * 300}), 400,
          "purpose")
    error(post(served, one, {"purpose": "batch", "expires_after[anchor]": "created_at",
                             "expires_after[seconds]": "60"}), 400, "expires_after.seconds")
    error(post(served, one, {"purpose": "batch", "expires_after[anchor]": "now",
                             "expires_after[seconds]": "3600"}), 400, "expires_after.anchor")
    # a body that stops before its closing boundary
    broken = httpx.post(url(served), content=b"--xx\r\ncontent-disposition: form-data; "
                        b"name=\"purpose\"\r\n\r\nbatch\r\n",
                        headers={"content-type": "multipart/form-data; boundary=xx"})
    assert "closing boundary" in error(broken, 400, None)
    for params, param in (({"limit": 0}, "limit"), ({"limit": 10_001}, "limit"),
                          ({"order": "up"}, "order"), ({"after": "nope"}, "after")):
        error(httpx.get(url(served), params=params), 400, param)
    assert rows(served) == (1, 2)         # the split file; a refused upload leaves nothing
    # the failures are labelled by route in the metrics
    text = httpx.get(f"http://127.0.0.1:{served.port}/metrics").text
    assert 'endpoint="/v1/files",status="400"' in text


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_over_max_file_bytes_is_413_and_leaves_nothing(serve):
    served = serve(max_file_bytes=2 * MiB, max_body_bytes=64 * 1024)
    # at the limit: accepted, though the body is far over --max-body-bytes
    assert post(served, {"file": ("a.bin", b"x" * 2 * MiB)}, {"purpose": "user_data"}
                ).status_code == 200
    # announced over it: refused before it is read (the file, or the form around it: the
    # length cannot say which)
    too_big = post(served, {"file": ("a.bin", b"x" * (3 * MiB))}, {"purpose": "user_data"})
    assert "--max-file-bytes" in error(too_big, 413, None)
    assert too_big.json()["error"]["code"] == "payload_too_large"

    # sent chunked (no length): refused once counted, with chunks already written
    def chunked():
        yield (b"--bb\r\ncontent-disposition: form-data; name=\"purpose\"\r\n\r\nuser_data"
               b"\r\n--bb\r\ncontent-disposition: form-data; name=\"file\"; "
               b"filename=\"b.bin\"\r\n\r\n")
        for _ in range(5):
            yield b"y" * MiB
        yield b"\r\n--bb--\r\n"
    refused = httpx.post(url(served), content=chunked(), timeout=30,
                         headers={"content-type": "multipart/form-data; boundary=bb"})
    error(refused, 413, "file")
    assert rows(served) == (1, 2)            # the first file's two chunks, nothing else


def padded_form(file: bytes, headers: int = 0, epilogue: int = 0) -> bytes:
    """A form of ``file`` and three fields, each part with ``headers`` extra 4000-byte header
    lines (python-multipart takes 8 of 4 KiB a part), ``epilogue`` bytes after its end."""
    pad = b"".join(b"x-pad-%d: %s\r\n" % (i, b"p" * 4000) for i in range(headers))
    fields = {b"purpose": b"user_data", b"expires_after[anchor]": b"created_at",
              b"expires_after[seconds]": b"3600"}
    parts = [b'content-disposition: form-data; name="%s"\r\n%s\r\n%s' % (k, pad, v)
             for k, v in fields.items()]
    parts.append(b'content-disposition: form-data; name="file"; filename="a.jsonl"\r\n'
                 + pad + b"\r\n" + file)
    return (b"".join(b"--bb\r\n" + part + b"\r\n" for part in parts) + b"--bb--\r\n"
            + b"e" * epilogue)


def pieces(body: bytes, size: int = 65536):
    return iter([body[i:i + size] for i in range(0, len(body), size)])


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_large_form_around_a_small_file_is_413_for_the_form(serve):
    """A 169-byte file in a form whose other bytes (its parts' headers, an epilogue) run
    past FORM_BYTES: the 413 says the form is too large, not the file, whether the length
    is announced or counted, whatever --max-file-bytes."""
    small = b"{}\n" * 56 + b"x"                               # 169 bytes
    kind = {"content-type": "multipart/form-data; boundary=bb"}
    for limit in (2 * MiB, 200 * MiB):
        served = serve(max_file_bytes=limit)
        for body in (padded_form(small, headers=7), padded_form(small, epilogue=3 * MiB)):
            for content in (body, pieces(body)):
                r = httpx.post(url(served), content=content, timeout=30, headers=kind)
                message = error(r, 413, None)
                assert "The file is larger" not in message, (limit, len(body), message)
                assert "form" in message and "65536 bytes" in message
        assert rows(served) == (0, 0)
    # a form just under the bound, around a file at its limit, is taken
    served = serve(max_file_bytes=MiB)
    body = padded_form(b"y" * MiB, headers=3, epilogue=16_000)
    assert 64_000 < len(body) - MiB < 65536
    r = httpx.post(url(served), content=pieces(body, 4096), timeout=30, headers=kind)
    assert r.status_code == 200 and r.json()["bytes"] == MiB, r.text


def multipart_stream(size: int, boundary: bytes = b"bb", piece: bytes = b"z" * MiB):
    """A multipart upload of ``size`` bytes of file, made a MiB at a time."""
    yield (b"--" + boundary + b"\r\ncontent-disposition: form-data; name=\"purpose\"\r\n\r\n"
           b"user_data\r\n--" + boundary + b"\r\ncontent-disposition: form-data; "
           b"name=\"file\"; filename=\"big.bin\"\r\n\r\n")
    for _ in range(size // len(piece)):
        yield piece
    yield b"\r\n--" + boundary + b"--\r\n"


def rss() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * 4096


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_big_upload_streams_through_bounded_memory(serve):
    """64 MiB up and down with --max-body-bytes at 1 MiB: the server (and this client) in
    this process, sampled every 5 ms, never grow by more than a fraction of the file."""
    served = serve(max_body_bytes=MiB, max_file_bytes=100 * MiB)
    size = 64 * MiB
    peak, stop = [rss()], threading.Event()

    def sample():
        while not stop.is_set():
            peak.append(max(peak[-1], rss()))
            time.sleep(0.005)
    base = rss()
    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        made = httpx.post(url(served), content=multipart_stream(size), timeout=120,
                          headers={"content-type": "multipart/form-data; boundary=bb"})
        assert made.status_code == 200, made.text
        file_id = made.json()["id"]
        assert made.json()["bytes"] == size
        digest, received = hashlib.sha256(), 0
        with httpx.stream("GET", f"{url(served)}/{file_id}/content", timeout=120) as down:
            assert down.headers["content-length"] == str(size)
            for part in down.iter_bytes():
                digest.update(part)
                received += len(part)
    finally:
        stop.set()
        sampler.join()
    assert received == size
    assert digest.digest() == hashlib.sha256(b"z" * size).digest()
    growth = max(peak) - base       # about 14 MiB measured (client, server and SQLite)
    assert growth < 24 * MiB, f"RSS grew {growth / MiB:.1f} MiB for a {size // MiB} MiB file"
    assert rows(served) == (1, 64)


def test_a_client_that_leaves_mid_upload_leaves_nothing(serve):
    served = serve()
    head = (b"POST /v1/files HTTP/1.1\r\nhost: x\r\ncontent-type: multipart/form-data; "
            b"boundary=bb\r\ncontent-length: %d\r\n\r\n" % (50 * MiB))
    stream = multipart_stream(50 * MiB)
    with socket.create_connection(("127.0.0.1", served.port)) as sock:
        sock.sendall(head)
        for _ in range(5):                   # the form's head and 4 MiB of the file
            sock.sendall(next(stream))
        deadline = time.monotonic() + 10
        while rows(served)[1] < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert rows(served)[1] >= 3          # chunks were written while it streamed
    deadline = time.monotonic() + 10
    while rows(served) != (0, 0) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert rows(served) == (0, 0)
    assert httpx.get(url(served)).json()["data"] == []


# -- expiry and abandoned uploads (the store, on the app's database) ----------------------

def test_expired_files_are_missing_then_pruned(serve):
    served = serve()
    sdk = served.client()
    made = sdk.files.create(file=("t.jsonl", b"{}\n"), purpose="user_data",
                            expires_after={"anchor": "created_at", "seconds": 3600})
    kept = sdk.files.create(file=("k.jsonl", b"{}\n"), purpose="user_data")
    store = served.app.state.files._store
    later = time.time() + 3601

    async def check():
        assert await store.get(made.id, "", later) is None
        assert (await store.get(kept.id, "", later)) is not None
        assert [f.id for f in (await store.page("", later, purpose=None, after=None,
                                                limit=10, order="desc"))[0]] == [kept.id]
        assert not await store.delete(made.id, "", later)
        assert await store.prune(time.time()) == 0
        assert await store.prune(later) == 1
        # an upload whose replica died: its row and chunks, untouched for an hour
        await store.write_chunk("file-" + "0" * 25, "", 0, b"abc")
        assert await store.prune(time.time()) == 0
        assert await store.prune(time.time() + 3601) == 1
    import asyncio
    asyncio.run(check())
    assert rows(served) == (1, 1)
    assert [f.id for f in sdk.files.list()] == [kept.id]


# -- what one key, and all of them, may hold ----------------------------------------------

@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_files_per_key_and_uploads_at_once_are_bounded(serve, monkeypatch):
    monkeypatch.setattr("podium.api.files.MAX_FILES", 2)
    monkeypatch.setattr("podium.api.files.MAX_UPLOADS", 1)
    served = serve(api_key=["key-a", "key-b"])
    a, b = served.client("key-a"), served.client("key-b")
    kept = [a.files.create(file=(f"{i}.jsonl", b"{}\n"), purpose="batch") for i in range(2)]
    with pytest.raises(openai.BadRequestError, match="at most 2 files"):
        a.files.create(file=("2.jsonl", b"{}\n"), purpose="batch")
    b.files.create(file=("b.jsonl", b"{}\n"), purpose="batch")      # each key its own
    a.files.delete(kept[0].id)
    a.files.create(file=("3.jsonl", b"{}\n"), purpose="batch")
    # an upload in progress holds the one slot: another is a 429, then goes through
    head = (b"POST /v1/files HTTP/1.1\r\nhost: x\r\nauthorization: Bearer key-b\r\n"
            b"content-type: multipart/form-data; boundary=bb\r\ncontent-length: %d\r\n\r\n"
            % (8 * MiB))
    with socket.create_connection(("127.0.0.1", served.port)) as sock:
        sock.sendall(head + next(multipart_stream(8 * MiB)))
        time.sleep(0.3)
        busy = httpx.post(url(served), files={"file": ("x.jsonl", b"{}\n")},
                          data={"purpose": "batch"}, headers={"authorization": "Bearer key-b"})
        assert busy.status_code == 429 and busy.headers["retry-after"]
        assert busy.json()["error"]["type"] == "rate_limit_error"
    deadline = time.monotonic() + 10
    while served.app.state.files._uploads and time.monotonic() < deadline:
        time.sleep(0.02)
    assert b.files.create(file=("y.jsonl", b"{}\n"), purpose="batch").bytes == 3
