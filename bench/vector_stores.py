"""Vector stores: search latency by store size, recall against an exact scan, and what
ingestion costs beyond the embedding itself.

    .venv/bin/python bench/vector_stores.py [--sizes 1000,10000,100000] [--queries 50]
                                            [--ingest-docs 40] [--db sqlite|URL]

search   A store of N chunks of random unit 384-dimensional float32 vectors (MiniLM's
         size; their files 100 chunks each, attributes ``{"group": i % 4}``) is written
         to the store's database (SQLite in a temporary directory by default) through
         ``VectorStoreStore``. Then, per query (random unit vectors): ``cold`` the first
         search after a change (the store's vectors read from SQL into one matrix, then the
         scan), ``warm`` the scan of the cached matrix (``Scan.top``: one matrix-vector
         product, a file mask, an argpartition) and the look-up of the best chunks' texts,
         ``filtered`` the same with an attribute filter (``group == 1``). Printed: the
         median and p95 milliseconds of each, and recall@5 of ``Scan.top`` against a plain
         numpy exact scan (argsort of every score) on the same queries.
ingest   ``--ingest-docs`` documents of about 2,000 words of varied English (deterministic)
         ingested by the ``Ingestor`` with the real all-MiniLM-L6-v2 (llama.cpp, 2
         threads): chunks/s from claim to completed (reading, chunking in the model's
         tokens, embedding at batch priority, writing), against the same chunks' texts
         embedded by the engine alone (``engine.embed``, 32 at a time): inputs/s. The ratio
         is what ingestion costs beyond the embedding.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from podium.api.vector_ingest import EMBED_BATCH, Ingestor, chunk_text, counter
from podium.api.vector_stores import Index, matches
from podium.store.files import FileStore, StoredFile, new_id
from podium.store.sql import SQLStore
from podium.store.vector_stores import VectorStoreStore

DIMS = 384
WORDS = ("harbor lamp keeper storm ledger tax quarter filing soup leek potato butter stock "
         "engine decode token batch vector store search query result chunk overlap model "
         "river bridge granite winter orchard apple cider press market grain mill wheel "
         "signal copper wire voltage circuit theorem proof lemma integral series garden").split()


def unit(rng: np.random.Generator, n: int) -> np.ndarray:
    v = rng.standard_normal((n, DIMS)).astype("<f4")
    return v / np.linalg.norm(v, axis=1, keepdims=True)


async def make_store(store: VectorStoreStore, store_id: str, n: int,
                     rng: np.random.Generator) -> None:
    now = int(time.time())
    files = [f"file-{i:08d}" for i in range((n + 99) // 100)]
    await store.create(dict(id=store_id, owner="o", name=None, description=None, meta=None,
                            embedding_model="m", chunk_size=800, chunk_overlap=400,
                            created_at=now, expires_days=None, expires_at=None,
                            last_active_at=now),
                       [dict(store_id=store_id, file_id=f, owner="o", batch_id=None,
                             filename=f + ".txt", attributes={"group": i % 4},
                             chunk_size=800, chunk_overlap=400, created_at=now)
                        for i, f in enumerate(files)])
    vectors = unit(rng, n)
    for i, file_id in enumerate(files):
        claimed = await store.claim_file("bench", time.time() + 600, time.time())
        key = (claimed["store_id"], claimed["file_id"])
        rows = [(s, f"chunk {s} of {file_id}", vectors[i * 100 + s].tobytes())
                for s in range(min(100, n - i * 100))]
        await store.add_chunks(key, "bench", time.time() + 600, rows)
        await store.finish_file(key, "bench", "completed", 0, None)


def ms(values: list[float]) -> str:
    values = sorted(values)
    p95 = values[min(len(values) - 1, int(len(values) * 0.95))]
    return f"{statistics.median(values) * 1000:8.2f} / {p95 * 1000:8.2f}"


async def bench_search(url: str, sizes: list[int], n_queries: int) -> None:
    sql = SQLStore(url)
    store = VectorStoreStore(sql.engine)
    rng = np.random.default_rng(7)
    print(f"{'chunks':>8} {'cold ms (median / p95)':>24} {'warm ms':>20} "
          f"{'filtered ms':>20} {'recall@5':>9}")
    for n in sizes:
        store_id = f"vs_bench{n}"
        await make_store(store, store_id, n, rng)
        index = Index(store)
        queries = unit(rng, n_queries)
        cold, warm, filtered, recall = [], [], [], []
        flt = {"type": "eq", "key": "group", "value": 1}
        for q in queries[:5]:
            await store.touch(store_id, int(time.time()))
            await store.set_attributes(store_id, "file-00000000", "o", {"group": 0})  # a change
            started = time.perf_counter()
            scan = await index.scan(store_id)
            scan.top(q[None, :], np.ones(len(scan.files), bool), 10, -1.0)
            cold.append(time.perf_counter() - started)
        scan = await index.scan(store_id)
        for q in queries:
            for mask, out in ((np.ones(len(scan.files), bool), warm), (np.array(
                    [matches(flt, f["attributes"] or {}) for f in scan.files]), filtered)):
                started = time.perf_counter()
                scan = await index.scan(store_id)
                best = scan.top(q[None, :], mask, 10, -1.0)
                await store.texts(store_id, [(scan.files[f]["file_id"], s)
                                             for _, f, s in best])
                out.append(time.perf_counter() - started)
            exact = set(np.argsort(-(scan.matrix @ q))[:5].tolist())
            got = scan.top(q[None, :], np.ones(len(scan.files), bool), 5, -1.0)
            rows = {(f, s) for _, f, s in got}
            found = {i for i in exact if (int(scan.file_of[i]), int(scan.seq[i])) in rows}
            recall.append(len(found) / 5)
        print(f"{n:>8} {ms(cold):>24} {ms(warm):>20} {ms(filtered):>20} "
              f"{statistics.mean(recall):>9.3f}")
    sql.engine.dispose()


def documents(n: int) -> list[str]:
    rng = random.Random(11)
    out = []
    for _ in range(n):
        words = [rng.choice(WORDS) for _ in range(2000)]
        out.append(" ".join(w + ("." if rng.random() < 0.08 else "") for w in words))
    return out


async def bench_ingest(url: str, n_docs: int) -> None:
    from podium.engine.llamacpp.embed import LlamaEmbedder
    from podium.engine.llamacpp.model_files import EMBED_MODEL, default_model_path

    engine = LlamaEmbedder(default_model_path(EMBED_MODEL), served_name="m", n_threads=2)
    sql = SQLStore(url)
    files, store = FileStore(sql.engine), VectorStoreStore(sql.engine)
    docs = documents(n_docs)
    now = int(time.time())
    refs = []
    for i, text in enumerate(docs):
        file_id = new_id()
        data = text.encode()
        await files.finish(file_id, "o", 0, data, StoredFile(file_id, "user_data",
                                                             f"d{i}.txt", len(data), now, None))
        refs.append(dict(store_id="vs_ingest", file_id=file_id, owner="o", batch_id=None,
                         filename=f"d{i}.txt", attributes=None, chunk_size=800,
                         chunk_overlap=400, created_at=now))
    await store.create(dict(id="vs_ingest", owner="o", name=None, description=None,
                            meta=None, embedding_model="m", chunk_size=800,
                            chunk_overlap=400, created_at=now, expires_days=None,
                            expires_at=None, last_active_at=now), refs)

    @contextlib.asynccontextmanager
    async def embedders(name):
        yield engine
    ingestor = Ingestor(store, files, embedders, lease_seconds=600)
    await engine.embed([engine.tokenizer.encode("warm up")])
    started = time.perf_counter()
    while await ingestor.turn():
        pass
    ingest_s = time.perf_counter() - started
    size = min(800, engine.info.context_length - 8)
    count = counter(engine.tokenizer)
    pieces = [p for d in docs for p in chunk_text(d, count, size, min(400, size // 2))]
    started = time.perf_counter()
    for i in range(0, len(pieces), EMBED_BATCH):
        ids = [engine.tokenizer.encode(p)[:engine.info.context_length]
               for p in pieces[i:i + EMBED_BATCH]]
        await engine.embed(ids, -1)
    embed_s = time.perf_counter() - started
    (counts, _), = (await store.stats(["vs_ingest"])).values()
    assert counts == {"completed": n_docs}, counts
    print(f"ingestion: {len(pieces)} chunks of <= {size} tokens from {n_docs} documents: "
          f"{len(pieces) / ingest_s:.1f} chunks/s; the engine alone on the same chunks: "
          f"{len(pieces) / embed_s:.1f} inputs/s; ratio {embed_s / ingest_s:.3f}")
    await engine.aclose()
    sql.engine.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument("--queries", type=int, default=50)
    parser.add_argument("--ingest-docs", type=int, default=40)
    parser.add_argument("--db", default="sqlite")
    parser.add_argument("--skip", choices=("search", "ingest"), default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{Path(tmp) / 'bench.db'}" if args.db == "sqlite" else args.db
        if args.skip != "search":
            asyncio.run(bench_search(url, [int(s) for s in args.sizes.split(",")],
                                     args.queries))
        if args.skip != "ingest":
            asyncio.run(bench_ingest(url, args.ingest_docs))


if __name__ == "__main__":
    main()
