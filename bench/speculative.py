"""Speculative decoding benchmark (issue 42): what verifying drafts buys, in one run.

On the default model, in-process ``LlamaCppEngine``s (``deterministic=False``: the only mode
that drafts) at temperature 0, interleaved (every variant of a task back to back, the order
turned round each repeat), medians over ``--repeats``:

1. Code edits with Predicted Outputs: a Python file of 60-110 lines from this Python's own
   standard library and an edit (a constant changed, a function renamed, a variable renamed,
   type hints added); the prompt asks for the whole edited file back (the answer is cut at
   ``--edit-tokens``, to keep the run short) and the prediction is the original file.
   ``speculative="off"`` without the prediction (A) and with it (B): decode tokens/s (tokens
   after the first / time after the first token), B/A per task and overall (geometric mean
   of the tasks), the prediction's acceptance (accepted / drafted), whether B wrote A's
   tokens (where the first difference is), and how often A's answer holds the edit at all
   (the default model often writes the file back unchanged: then the prediction is all
   right, the best case). Target >= 2x.
2. The same edits with n-gram drafts alone (``speculative="ngram"``, no prediction) against
   A: target >= 1.3x.
3. Free chat, five prompts with little to copy (end of turn banned, each runs to
   ``--chat-tokens``): n-gram against off, target >= 0.97x.
4. Four concurrent streams (the first two edits, two chats, each cut at ``--crowd-tokens``):
   aggregate tokens/s (all tokens / wall time; and while all four decode, prefills left out)
   with drafts (n-grams and the edits' predictions) against none (off, no predictions):
   target >= 0.97x.
5. The engines' measured decode cost by row count (``StepCosts``: a moving average of the
   decodes that ran), and a verify of k draft tokens against a one-token step,
   c(k+1) / c(1) for k = 1, 3, 7, 15 (* where the row count was never measured: estimated).

The machine's load average is printed before and after: on a busy machine the figures are
noise. ``--quick`` (one repeat, two edits) only checks that it runs.

    .venv/bin/python bench/speculative.py [--quick] [--repeats 3] [--threads 2]
                                          [--edit-tokens 400] [--chat-tokens 128]
                                          [--crowd-tokens 192]
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import statistics
import sys
import sysconfig
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from podium.engine.base import EngineRequest, SamplingParams  # noqa: E402
from podium.engine.llamacpp.engine import LlamaCppEngine  # noqa: E402
from podium.engine.llamacpp.model_files import default_model_path  # noqa: E402
from podium.text.template import ChatTemplate  # noqa: E402


@dataclass(frozen=True)
class Edit:
    file: str           # in the standard library of the Python running this
    ask: str
    expect: str         # text the edited file holds (did the model make the edit at all)


EDITS = [
    Edit("secrets.py", "Change the constant DEFAULT_ENTROPY from 32 to 64.",
         "DEFAULT_ENTROPY = 64"),
    Edit("signal.py", "Rename the function `_wraps` to `_copy_doc`, everywhere.",
         "def _copy_doc("),
    Edit("_bootsubprocess.py", "Rename the variable `safe_chars` to `allowed`.", "allowed = []"),
    Edit("_sitebuiltins.py", "Add type hints to `Quitter.__init__`: `name` and `eof` are "
         "str, and it returns None.", "name: str"),
]
CHATS = ["Write a short story about a lighthouse keeper who finds a message in a bottle.",
         "Explain how a refrigerator keeps food cold, for a curious ten-year-old.",
         "Give me ten ideas for a rainy weekend at home, one sentence each.",
         "What were the main causes of the French Revolution?",
         "Write a friendly letter inviting a neighbour to a garden party next Saturday."]


@dataclass
class Run:
    start: float
    tokens: list[int] = field(default_factory=list)
    stamps: list[float] = field(default_factory=list)   # when each token arrived
    drafted: int = 0        # prediction draft tokens verified, and of them accepted
    accepted: int = 0

    @property
    def rate(self) -> float:
        """Decode tokens/s: the tokens after the first over the time after the first."""
        return (len(self.tokens) - 1) / (self.stamps[-1] - self.stamps[0]) \
            if len(self.tokens) > 1 else math.nan


@dataclass
class Prompt:
    ids: list[int]
    max_tokens: int
    prediction: tuple[int, ...] | None = None   # an edit's original file
    ban_end: bool = False


async def generate(engine: LlamaCppEngine, prompt: Prompt, predict: bool) -> Run:
    bias = {t: -100.0 for t in engine.tokenizer.eos_token_ids} if prompt.ban_end else {}
    sampling = SamplingParams(temperature=0.0, max_tokens=prompt.max_tokens, logit_bias=bias,
                              prediction=prompt.prediction if predict else None)
    request = EngineRequest(f"bench-{time.monotonic_ns()}", prompt.ids, sampling)
    run = Run(time.perf_counter())
    async for out in engine.generate(request):
        run.stamps += [time.perf_counter()] * len(out.token_ids)
        run.tokens += out.token_ids
        run.accepted += out.accepted_prediction
        run.drafted += out.accepted_prediction + out.rejected_prediction
    return run


def one(engine: LlamaCppEngine, prompt: Prompt, predict: bool = False) -> Run:
    return asyncio.run(generate(engine, prompt, predict))


def crowd(engine: LlamaCppEngine, prompts: list[Prompt], predict: bool) -> tuple[float, float]:
    """Aggregate tokens/s of ``prompts`` generated at once: every token over the wall time
    (their prefills in it), and the tokens while every one of them decodes (from the last
    first token to the first last token: no prefill in it) over that time."""
    async def all_at_once() -> list[Run]:
        return await asyncio.gather(*(generate(engine, p, predict) for p in prompts))

    runs = asyncio.run(all_at_once())
    wall = max(r.stamps[-1] for r in runs) - min(r.start for r in runs)
    first, last = max(r.stamps[0] for r in runs), min(r.stamps[-1] for r in runs)
    inside = sum(first < t <= last for r in runs for t in r.stamps)
    return (sum(len(r.tokens) for r in runs) / wall,
            inside / (last - first) if last > first else math.nan)


def first_difference(pairs: Iterable[tuple[Run, Run]]) -> int | None:
    """The earliest token at which the two runs of a pair wrote different tokens, over all
    the pairs (None when every pair wrote the same)."""
    found = []
    for left, right in pairs:
        a, b = left.tokens, right.tokens
        at = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        if not at == len(a) == len(b):
            found.append(at)
    return min(found, default=None)


def geomean(values: list[float]) -> float:
    return math.exp(statistics.fmean(math.log(v) for v in values))


def loadavg() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="one repeat, two edits: does it run")
    ap.add_argument("--repeats", type=int, default=3, help="runs of each variant (median)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--edit-tokens", type=int, default=400,
                    help="per edited file, at most (each edit begins in its first 310)")
    ap.add_argument("--chat-tokens", type=int, default=128, help="per free-chat answer")
    ap.add_argument("--crowd-tokens", type=int, default=192,
                    help="per stream of the four concurrent ones")
    args = ap.parse_args()
    repeats = 1 if args.quick else args.repeats
    edits = EDITS[:2] if args.quick else EDITS
    began = time.perf_counter()
    print(f"# Podium speculative decoding benchmark ({os.cpu_count()} cores, threads="
          f"{args.threads}, repeats={repeats}); load average before: {loadavg()}", flush=True)

    path = default_model_path()
    engines = {spec: LlamaCppEngine(path, served_name="bench", n_ctx=4096, n_batch=64,
                                    n_threads=args.threads, max_num_seqs=4,
                                    deterministic=False, speculative=spec)
               for spec in ("off", "ngram")}
    off, ngram = engines["off"], engines["ngram"]
    tokenizer = off.tokenizer
    template = ChatTemplate(off.info.chat_template or "")

    def chat(text: str) -> list[int]:
        return tokenizer.encode(template.render([{"role": "user", "content": text}]))

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    tasks: list[Prompt] = []
    for edit in edits:
        source = (stdlib / edit.file).read_text()
        original = tuple(tokenizer.encode(source, add_special=False))
        # the instruction after the file: the default model follows it more often there
        ask = f"```python\n{source}```\n\n{edit.ask} Reply with the whole edited file."
        tasks.append(Prompt(chat(ask), args.edit_tokens, original))
    chats = [Prompt(chat(text), args.chat_tokens, ban_end=True) for text in CHATS]
    # all four cut at the same length, so the four run side by side to the end
    mixed = [Prompt(t.ids, args.crowd_tokens, t.prediction, ban_end=True) for t in tasks[:2]] \
        + [Prompt(chat(text), args.crowd_tokens, ban_end=True) for text in CHATS[:2]]
    for engine in engines.values():             # weights paged in, first decodes out of the way
        one(engine, Prompt(chat("Say hello."), 16))

    # (A, B, C) per edit: off alone, off with the prediction, n-grams alone
    edit_runs: list[dict[str, list[Run]]] = [{"A": [], "B": [], "C": []} for _ in tasks]
    ngram_counts = [[0, 0] for _ in tasks]      # n-gram draft tokens verified, accepted
    chat_runs: list[dict[str, list[Run]]] = [{"off": [], "ngram": []} for _ in chats]
    crowd_rates: dict[str, list[tuple[float, float]]] = {"none": [], "drafts": []}
    for r in range(repeats):
        def turn(names: list[str]) -> list[str]:
            """Every other repeat the other way round: a drifting load favours neither."""
            return names if r % 2 == 0 else names[::-1]

        laps = [time.perf_counter()]
        for i, task in enumerate(tasks):
            for name in turn(["A", "B", "C"]):
                before = (ngram.stats["drafted_ngram"], ngram.stats["accepted_ngram"])
                run = one(ngram if name == "C" else off, task, predict=name == "B")
                if name == "C":
                    ngram_counts[i][0] += ngram.stats["drafted_ngram"] - before[0]
                    ngram_counts[i][1] += ngram.stats["accepted_ngram"] - before[1]
                edit_runs[i][name].append(run)
        laps.append(time.perf_counter())
        # straight after the edits, whose prompts the engines still hold (as a client sending
        # the same file again would find them)
        for name in turn(["none", "drafts"]):
            crowd_rates[name].append(crowd(ngram if name == "drafts" else off, mixed,
                                           predict=name == "drafts"))
        laps.append(time.perf_counter())
        for i, prompt in enumerate(chats):
            for name in turn(["off", "ngram"]):
                chat_runs[i][name].append(one(engines[name], prompt))
        laps.append(time.perf_counter())
        print(f"  repeat {r + 1}/{repeats}: edits {laps[1] - laps[0]:.0f} s, crowd "
              f"{laps[2] - laps[1]:.0f} s, chats {laps[3] - laps[2]:.0f} s; "
              f"{laps[3] - began:.0f} s in all", flush=True)

    def rate(runs: list[Run]) -> float:
        return statistics.median(run.rate for run in runs)

    print("\n## 1-2. code edits: decode tokens/s; A off, B off + prediction, C n-grams")
    b_ratios, c_ratios = [], []
    differ: dict[str, list[str]] = {"B": [], "C": [], "A (a later repeat)": []}
    drafted = accepted = 0
    for i, (edit, task, runs) in enumerate(zip(edits, tasks, edit_runs)):
        a, b, c = rate(runs["A"]), rate(runs["B"]), rate(runs["C"])
        b_ratios.append(b / a)
        c_ratios.append(c / a)
        d = sum(run.drafted for run in runs["B"])
        k = sum(run.accepted for run in runs["B"])
        drafted, accepted = drafted + d, accepted + k
        nd, nk = ngram_counts[i]
        made = sum(edit.expect in tokenizer.decode(run.tokens) for run in runs["A"])
        print(f"{edit.file:>18}: {len(task.prediction or ()):4d}-token file, A wrote "
              f"{len(runs['A'][0].tokens)} tokens (edit made {made}/{len(runs['A'])}); "
              f"A {a:5.1f}  B {b:5.1f} ({b / a:.2f}x, accepted {k}/{d} = "
              f"{k / max(d, 1):.2f})  C {c:5.1f} ({c / a:.2f}x, n-grams accepted "
              f"{nk}/{nd} = {nk / max(nd, 1):.2f})")
        for name, pairs in (("B", zip(runs["A"], runs["B"])), ("C", zip(runs["A"], runs["C"])),
                            ("A (a later repeat)", ((runs["A"][0], x) for x in runs["A"][1:]))):
            at = first_difference(pairs)
            if at is not None:
                differ[name].append(f"{edit.file} at token {at}")
    print(f"overall (geometric mean of the tasks): B/A {geomean(b_ratios):.2f}x (target >= 2), "
          f"prediction acceptance {accepted}/{drafted} = {accepted / max(drafted, 1):.2f}; "
          f"C/A {geomean(c_ratios):.2f}x (target >= 1.3)")
    for name, where in differ.items():
        print(f"tasks where {name}'s tokens differ from A's: {len(where)}"
              + (f" ({'; '.join(where)})" if where else ""))

    print(f"\n## 3. free chat ({args.chat_tokens} tokens each): decode tokens/s, off vs n-grams")
    ratios = []
    for text, runs in zip(CHATS, chat_runs):
        a, c = rate(runs["off"]), rate(runs["ngram"])
        ratios.append(c / a)
        print(f"{text[:48]:>48}: off {a:5.1f}  ngram {c:5.1f} ({c / a:.2f}x)")
    print(f"overall (geometric mean): {geomean(ratios):.2f}x (target >= 0.97)")

    print(f"\n## 4. four concurrent streams (2 edits, 2 chats, {args.crowd_tokens} tokens each): "
          f"aggregate tokens/s")
    for i, what in enumerate(("over the whole run", "while all four decode")):
        none, drafts = (statistics.median(x[i] for x in crowd_rates[k])
                        for k in ("none", "drafts"))
        print(f"{what:>21}: no drafts {none:5.1f}, drafts (n-grams + predictions) "
              f"{drafts:5.1f}: {drafts / none:.2f}x (target >= 0.97)")

    print("\n## 5. measured decode cost by rows (ms, moving average)")
    for name, engine in engines.items():
        costs = engine._costs
        table = ", ".join(f"{n}: {s * 1000:.1f}" for n, s in enumerate(costs._seconds) if s)
        print(f"{name:>5}: {table}")
        print(f"{'':>5}  c(k+1)/c(1): " + ", ".join(
            f"k={k} {costs.cost(k + 1) / costs.cost(1):.2f}"
            + ("" if costs._seconds[k + 1] else "*") for k in (1, 3, 7, 15)))
    for engine in engines.values():
        asyncio.run(engine.aclose())
    print(f"\nload average after: {loadavg()}; {time.perf_counter() - began:.0f} s in all")


if __name__ == "__main__":
    main()
