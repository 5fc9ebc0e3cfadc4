"""Do a verify batch's logits equal one-token-at-a-time logits on this machine? (issue 42)

A draft is verified by decoding the sequence's next token and its draft tokens together: k+1
rows of one sequence in one ``llama_decode``. Speculation keeps its promise (the same answer
with or without drafts) only if each row's logits are the numbers that row gets when its
tokens are decoded one a step. This probe generates ``--tokens`` tokens greedily one a step
(the reference), then decodes the same tokens again in verify batches of k rows (alone, and
beside other sequences' single rows), and prints per k the largest logit difference and how
many positions' greedy choice changed; then the cost of a k-row decode against a 1-row one.

    .venv/bin/python bench/verify_numerics.py [--deterministic | --no-deterministic]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import llama_cpp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from podium.engine.llamacpp.model import LlamaModel, LlamaTokenizer  # noqa: E402
from podium.engine.llamacpp.model_files import default_model_path  # noqa: E402
from podium.engine.llamacpp.sampling import logits_row  # noqa: E402

PROMPT = ("<|im_start|>user\nRewrite this function with the variable `total` renamed to "
          "`acc`:\n\ndef add_all(xs):\n    total = 0\n    for x in xs:\n        total += x\n"
          "    return total\n<|im_end|>\n<|im_start|>assistant\n")


class Probe:
    def __init__(self, deterministic: bool, threads: int, seqs: int = 4,
                 flash: bool | None = None, companion: bool = False):
        self.companion, self.scratch = companion, seqs
        path = default_model_path()
        self.model = LlamaModel(path, n_ctx=2048, n_batch=128, n_threads=threads,
                                n_seq_max=seqs + 1, extra_buffers=not deterministic,
                                flash_attention=not deterministic if flash is None else flash)
        self.tok = LlamaTokenizer(self.model)
        self.n_vocab = self.tok.vocab_size
        self.batch = llama_cpp.llama_batch_init(128, 0, 1)
        self.mem = llama_cpp.llama_get_memory(self.model.ctx)

    def decode(self, rows: list[tuple[int, int, int]]) -> float:
        """(seq, pos, token) rows, logits for every row; seconds. With ``companion``, a lone
        row gets a second row in a scratch sequence beside it (its numbers unused)."""
        if self.companion and len(rows) == 1:
            llama_cpp.llama_memory_seq_rm(self.mem, self.scratch, 0, -1)
            rows = rows + [(self.scratch, 0, rows[0][2])]
        b = self.batch
        b.n_tokens = len(rows)
        for i, (seq, pos, tok) in enumerate(rows):
            b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = tok, pos, 1, True
            b.seq_id[i][0] = seq
        start = time.perf_counter()
        rc = llama_cpp.llama_decode(self.model.ctx, b)
        if rc != 0:
            raise RuntimeError(f"llama_decode: {rc}")
        return time.perf_counter() - start

    def row(self, i: int) -> np.ndarray:
        return logits_row(self.model.ctx, i, self.n_vocab).copy()

    def prefill(self, seq: int, prompt: list[int]) -> None:
        llama_cpp.llama_memory_seq_rm(self.mem, seq, 0, -1)
        for start in range(0, len(prompt) - 1, 64):
            chunk = prompt[start:min(start + 64, len(prompt) - 1)]
            self.decode([(seq, start + j, t) for j, t in enumerate(chunk)])

    def reference(self, prompt: list[int], n: int) -> tuple[list[int], list[np.ndarray]]:
        """Greedy, one token a step: the tokens and each step's logits."""
        self.prefill(0, prompt)
        tokens, logits, pos, tok = [], [], len(prompt) - 1, prompt[-1]
        for _ in range(n):
            self.decode([(0, pos, tok)])
            row = self.row(0)
            logits.append(row)
            tok, pos = int(row.argmax()), pos + 1
            tokens.append(tok)
        return tokens, logits

    def verified(self, prompt: list[int], tokens: list[int], k: int, crowd: int
                 ) -> list[np.ndarray]:
        """The same positions decoded k+1 rows at a time (the next token and k drafts),
        beside ``crowd`` other sequences' one row each."""
        self.prefill(0, prompt)
        for s in range(1, crowd + 1):
            self.prefill(s, prompt[: len(prompt) // (s + 1)])
        seq_in = [prompt[-1]] + tokens
        base = len(prompt) - 1
        out: list[np.ndarray] = []
        at, others = 0, [len(prompt) // (s + 1) - 1 for s in range(1, crowd + 1)]
        while at < len(tokens):
            rows = [(0, base + at + j, seq_in[at + j]) for j in range(min(k + 1, len(tokens) - at))]
            extra = [(s + 1, others[s], 42) for s in range(crowd)]
            self.decode(rows + extra)
            out += [self.row(j) for j in range(len(rows))]
            others = [p + 1 for p in others]
            at += len(rows)
        return out[:len(tokens)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--deterministic", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--ks", default="1,2,3,4,6")
    ap.add_argument("--flash", action=argparse.BooleanOptionalAction, default=None,
                    help="flash attention (default: off when deterministic, as the engine)")
    ap.add_argument("--companion", action="store_true",
                    help="a lone row decodes beside a scratch sequence's row")
    ap.add_argument("--no-timing", action="store_true")
    ap.add_argument("--long", type=int, default=0, help="pad the prompt to this many tokens")
    args = ap.parse_args()
    probe = Probe(args.deterministic, args.threads, flash=args.flash,
                  companion=args.companion)
    prompt = probe.tok.encode(PROMPT, add_special=False)
    if args.long > len(prompt):
        filler = probe.tok.encode("# a line of padding\n" * args.long, add_special=False)
        prompt = filler[:args.long - len(prompt)] + prompt
    tokens, ref = probe.reference(prompt, args.tokens)
    print(f"deterministic={args.deterministic} flash={args.flash} "
          f"companion={args.companion} prompt {len(prompt)} tokens, {len(tokens)} "
          f"generated: {probe.tok.decode(tokens)[:60]!r}...")
    for k in map(int, args.ks.split(",")):
        for crowd in (0, 2):
            if args.deterministic and k + 1 + crowd > 7:
                continue
            got = probe.verified(prompt, tokens, k, crowd)
            diff = max(float(np.abs(a - b).max()) for a, b in zip(ref, got))
            changed = sum(int(a.argmax()) != int(b.argmax()) for a, b in zip(ref, got))
            print(f"  verify k={k} (+{crowd} other rows): max |logit diff| {diff:.4g}, "
                  f"greedy choice changed at {changed}/{len(tokens)} positions")
    # cost of an n-row decode of one sequence against a 1-row decode
    probe.prefill(0, prompt)
    base = len(prompt) - 1
    for n in (1, 2, 3, 4, 5, 6, 7, 8, 12, 16)[:0 if args.no_timing else None]:
        times = []
        for _ in range(12):
            times.append(probe.decode([(0, base + j, tokens[j]) for j in range(n)]))
            llama_cpp.llama_memory_seq_rm(probe.mem, 0, base, -1)
        print(f"  decode of {n:2d} rows: {statistics.median(times) * 1000:6.2f} ms")


if __name__ == "__main__":
    main()
