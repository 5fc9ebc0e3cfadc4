"""Embeddings fairness: one client's 1-input request while another's big request runs, and
what the server does when the big client leaves (issue 38, item 1).

    .venv/bin/podium serve --model all-minilm-l6-v2 --threads 2 --port 8765 --log-level warning
    .venv/bin/python bench/embed_fairness.py --url http://127.0.0.1:8765 [--inputs 2048]

Inputs are varied English of about 240 words, each cut to exactly ``--tokens`` tokens by
``truncate_prompt_tokens`` (256: all-MiniLM-L6-v2's length, the campaign's inputs). Printed:

  alone      a 1-input request's latency on an idle server (median of 5).
  stays      the big request (``--inputs`` x ``--tokens``, the campaign's) runs to its end;
             a victim's 1-input request every second from 2 s in: their latencies (each
             sent a second after the previous one's answer).
  campaign   only when the server refuses the campaign's request (a 400 past its
             --max-embedding-tokens): the refusal; then "stays" again with the largest
             request the bound allows (``--max-tokens`` // ``--tokens`` inputs).
  leaves     the big request's client closes its connection after ``--leave-after`` s; then
             a victim's latency, and the inputs the server embedded after the client left
             (``/health``'s engine ``requests``, inputs embedded, read until it settles).
"""

from __future__ import annotations

import argparse
import http.client
import json
import random
import statistics
import threading
import time
from urllib.parse import urlsplit

WORDS = ("lighthouse keeper harbour river winter market bridge garden station museum "
         "library orchestra village teacher engineer bakery mountain forest council "
         "newspaper festival railway summer morning evening report letter history weather "
         "kitchen window journey island valley castle painter farmer doctor student").split()


def texts(n: int, words: int = 240) -> list[str]:
    """``n`` deterministic inputs, each of ``words`` words (more than 256 tokens)."""
    return [" ".join(random.Random(i).choice(WORDS) for _ in range(words)) + f" {i}"
            for i in range(n)]


class Server:
    def __init__(self, url: str, model: str):
        parts = urlsplit(url)
        self.host, self.port, self.model = parts.hostname or "127.0.0.1", parts.port or 80, model

    def post(self, inputs: list[str], tokens: int, timeout: float | None = None
             ) -> tuple[int, dict, float]:
        body = json.dumps({"model": self.model, "input": inputs,
                           "truncate_prompt_tokens": tokens}).encode()
        conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        started = time.perf_counter()
        conn.request("POST", "/v1/embeddings", body, {"content-type": "application/json"})
        answer = conn.getresponse()
        data = json.loads(answer.read())
        conn.close()
        return answer.status, data, time.perf_counter() - started

    def leave_after(self, inputs: list[str], tokens: int, seconds: float) -> float:
        """Send the request, close the connection ``seconds`` later; when it was closed."""
        body = json.dumps({"model": self.model, "input": inputs,
                           "truncate_prompt_tokens": tokens}).encode()
        conn = http.client.HTTPConnection(self.host, self.port, timeout=seconds)
        conn.request("POST", "/v1/embeddings", body, {"content-type": "application/json"})
        try:
            conn.getresponse().read()
            print("  (the big request was answered before its client left)")
        except (TimeoutError, OSError):
            pass
        conn.close()
        return time.perf_counter()

    def embedded(self) -> int:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=30)
        conn.request("GET", "/health")
        health = json.loads(conn.getresponse().read())
        conn.close()
        return int(health.get("engine", {}).get("requests", 0))

    def victim(self) -> float:
        status, _, took = self.post(["A victim's one short input."], 256)
        assert status == 200, status
        return took


def stays(server: Server, n: int, tokens: int, pool: list[str]) -> tuple[int, dict]:
    """The big request run to its end beside a victim a second from 2 s in: its status and
    answer (a 400 comes back at once, with no victim sent)."""
    result: dict = {}

    def big() -> None:
        result["status"], result["data"], result["took"] = server.post(pool[:n], tokens)

    thread = threading.Thread(target=big)
    thread.start()
    time.sleep(2)
    victims = []
    while thread.is_alive():
        victims.append(server.victim())
        time.sleep(1)
    thread.join()
    if victims:
        print(f"stays      big {n} x {tokens}: {result['status']} in {result['took']:.1f} s; "
              f"{len(victims)} victims: median {statistics.median(victims):.3f} s, "
              f"max {max(victims):.3f} s")
    return result["status"], result["data"]


def leaves(server: Server, n: int, tokens: int, seconds: float, pool: list[str]) -> None:
    before = server.embedded()
    left = server.leave_after(pool[:n], tokens, seconds)
    at_leaving = server.embedded()
    victim = server.victim()
    last, settled = server.embedded(), time.perf_counter()
    while True:         # until nothing more is embedded for 3 s
        time.sleep(0.5)
        now = server.embedded()
        if now != last:
            last, settled = now, time.perf_counter()
        elif time.perf_counter() - settled > 3:
            break
    after = last - at_leaving - 1           # less the victim's input
    print(f"leaves     big {n} x {tokens}, its client gone after {seconds:.0f} s: victim "
          f"{victim:.3f} s; inputs embedded while it was there {at_leaving - before}, after "
          f"it left {after} (for {max(0.0, settled - left):.1f} s)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="http://127.0.0.1:8765")
    parser.add_argument("--model", default="all-minilm-l6-v2")
    parser.add_argument("--inputs", type=int, default=2048)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--max-tokens", type=int, default=300_000,
                        help="the server's --max-embedding-tokens (for the big request's "
                             "size when the campaign's is refused)")
    parser.add_argument("--leave-after", type=float, default=5.0)
    args = parser.parse_args()
    server = Server(args.url, args.model)
    pool = texts(args.inputs)
    alone = statistics.median(server.victim() for _ in range(5))
    print(f"alone      1 input: {alone:.3f} s")
    n = args.inputs
    status, data = stays(server, n, args.tokens, pool)
    if status != 200:
        said = data.get("error", {}).get("message", "")
        n = min(n, args.max_tokens // args.tokens)
        print(f"campaign   {args.inputs} x {args.tokens} tokens: {status} {said[:150]}")
        stays(server, n, args.tokens, pool)
    leaves(server, n, args.tokens, args.leave_after, pool)


if __name__ == "__main__":
    main()
