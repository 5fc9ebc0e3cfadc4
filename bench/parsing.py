"""Output-parser cost per delta: on a long mixed stream, and per family on one big tool call.

    .venv/bin/python bench/parsing.py                       # both parts
    .venv/bin/python bench/parsing.py --calls-only --families hermes,qwen3_coder \\
        --sizes 1,100,400 --repeat 5 --json out.json

Part 1, stream: a Hermes answer (reasoning, text, then tool calls whose arguments hold long
strings) cut into the default model's real tokens; the parser gets one token's text at a time.
Targets: <= 2 us per token; 16k-token streams within 10% of 1k-token streams per token.
Both sizes parse the same number of tokens (16 streams of 1k, one of 16k); the minimum of
9 runs is the figure least disturbed by other work on the machine.

Part 2, calls: for every tool-parser family, one ``write_file`` call whose ``content``
argument is N KB of real source text (the standard library's, with its quotes, backslashes
and newlines), written the way the family writes it (a JSON string, a Python literal, or raw
text between XML tags), fed in 4-character deltas (``--tokens``: the default model's tokens).
The figure is the whole call's parse time divided by its deltas; every size parses about the
same number of characters (400 calls of 1 KB, 4 of 100 KB, one of 400 KB), sizes interleaved.
Target: per-delta cost at 400 KB within 1.5x of 1 KB, every family (agents write whole files
as tool arguments). Each figure is the median of ``--repeat`` runs.

Part 3, ``--blanks`` (instead of part 2): the same measure on N KB of blanks (a model looping
on newlines) spread over the places where each family's parser waits to see what follows: the
start of the answer, inside, between and after calls.
"""

from __future__ import annotations

import argparse
import codecs
import json
import logging
import statistics
import sysconfig
import time
from pathlib import Path

from podium.parsing.events import Finish, TextDelta, ToolCallEnd
from podium.parsing.pipeline import OutputParser
from podium.parsing.registry import build_reasoning_parser, build_tool_parser
from podium.parsing.tools.base import ToolSet

SCHEMAS = {"write_file": {"type": "object", "properties": {"path": {"type": "string"},
                                                           "content": {"type": "string"}}}}
FAMILIES = ("hermes", "qwen3_coder", "glm45", "llama3_json", "pythonic", "mistral",
            "deepseek_v3", "kimi_k2", "json")
PATH = "src/big_module.py"


def _tokenizer():
    from podium.engine.llamacpp.model import LlamaModel, LlamaTokenizer
    from podium.engine.llamacpp.model_files import default_model_path
    return LlamaTokenizer(LlamaModel(default_model_path(), vocab_only=True))


# -- part 1: a long mixed Hermes stream ---------------------------------------------------

def stream_text(tokens_wanted: int, tokenizer) -> list[str]:
    line = "    total = compute(values, weights) + offset  # keep it simple\n"
    calls, text = 0, "<think>Write the files.</think>\nWriting them now.\n"
    while True:
        body = json.dumps({"path": f"src/m{calls}.py", "content": line * 40})
        text += f'<tool_call>\n{{"name": "write_file", "arguments": {body}}}\n</tool_call>\n'
        calls += 1
        ids = tokenizer.encode(text, add_special=False)
        if len(ids) >= tokens_wanted:
            break
    ids = ids[:tokens_wanted]
    return [tokenizer.piece(t).decode("utf-8", "replace") for t in ids]


def cost_per_token(pieces: list[str], streams: int) -> float:
    """Parse ``streams`` streams of ``pieces`` (so short and long runs see as many tokens)."""
    deltas = [[TextDelta(p)] for p in pieces]
    start = time.perf_counter()
    for _ in range(streams):
        parser = OutputParser(build_reasoning_parser("think", ""),
                              build_tool_parser("hermes", ToolSet(SCHEMAS)))
        for delta in deltas:
            parser.feed(delta)
        parser.feed([Finish("stop", len(pieces))])
    return (time.perf_counter() - start) * 1e6 / (len(pieces) * streams)


def bench_stream(tokenizer) -> dict:
    results, streams = {}, {1_000: 16, 16_000: 1}
    for n in (1_000, 16_000):
        pieces = stream_text(n, tokenizer)
        cost_per_token(pieces, streams[n])                   # warm up
        runs = [cost_per_token(pieces, streams[n]) for _ in range(9)]
        results[n] = min(runs)
        print(f"parser cost, {n:>6}-token streams: {min(runs):.2f} us per token "
              f"(min of 9; median {statistics.median(runs):.2f})")
    print(f"16k / 1k per-token ratio (min): {results[16_000] / results[1_000]:.3f}")
    return results


# -- part 2: one big call per family ------------------------------------------------------

def source_text(size: int) -> str:
    """``size`` characters of real Python source: the standard library, files in name order."""
    parts, total = [], 0
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        parts.append(path.read_text(encoding="utf-8"))
        total += len(parts[-1])
        if total >= size:
            break
    return "".join(parts)[:size]


def call_text(family: str, content: str) -> str:
    """One write_file call, as ``family`` writes it."""
    args = json.dumps({"path": PATH, "content": content}, ensure_ascii=False)
    call = json.dumps({"name": "write_file", "arguments": {"path": PATH, "content": content}},
                      ensure_ascii=False)
    if family == "hermes":
        return f"Writing it.\n<tool_call>\n{call}\n</tool_call>"
    if family == "qwen3_coder":
        return (f"Writing it.\n<tool_call>\n<function=write_file>\n<parameter=path>\n{PATH}\n"
                f"</parameter>\n<parameter=content>\n{content}\n</parameter>\n</function>\n"
                f"</tool_call>")
    if family == "glm45":
        return (f"Writing it.<tool_call>write_file\n<arg_key>path</arg_key>\n<arg_value>{PATH}"
                f"</arg_value>\n<arg_key>content</arg_key>\n<arg_value>{content}</arg_value>\n"
                f"</tool_call>")
    if family == "llama3_json":
        return call.replace('"arguments"', '"parameters"', 1)
    if family == "pythonic":
        literal = json.dumps(content, ensure_ascii=False)      # also a valid Python literal
        return f'[write_file(path="{PATH}", content={literal})]'
    if family == "mistral":
        return f"Writing it.[TOOL_CALLS]write_file[ARGS]{args}"
    if family == "deepseek_v3":
        return (f"Writing it.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>write_file<｜tool▁sep｜>"
                f"{args}<｜tool▁call▁end｜><｜tool▁calls▁end｜>")
    if family == "kimi_k2":
        return (f"Writing it.<|tool_calls_section_begin|><|tool_call_begin|>functions.write_file:0"
                f"<|tool_call_argument_begin|>{args}<|tool_call_end|><|tool_calls_section_end|>")
    if family == "json":
        return f"```json\n{call}\n```"
    raise ValueError(family)


# {ws}: where each family's parser waits to see what follows blanks
BLANK_RUNS = {
    "hermes": '{ws}<tool_call>{"name": "write_file", "arguments": {"path": "a"}}{ws}</tool_call>'
              '{ws}Done.',
    "qwen3_coder": "{ws}<tool_call>\n<function=write_file>{ws}<parameter=path>\na\n"
                   "</parameter>{ws}</function>{ws}</tool_call>Done.",
    "glm45": "{ws}<tool_call>write_file\n<arg_key>path</arg_key>{ws}<arg_value>a</arg_value>"
             "{ws}</tool_call>Done.",
    "llama3_json": '{ws}{"name": "write_file", "parameters": {"path": "a"}}{ws};{ws}'
                   '{"name": "write_file", "parameters": {"path": "a"}}{ws}Done.',
    "pythonic": '{ws}[write_file(path="a"),{ws}write_file(path="a")]{ws}Done.',
    "mistral": '{ws}[TOOL_CALLS]write_file[ARGS]{"path": "a"}{ws}'
               '[TOOL_CALLS]write_file[ARGS]{"path": "a"}{ws}Done.',
    "deepseek_v3": '{ws}<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>write_file<｜tool▁sep｜>'
                   '{"path": "a"}{ws}<｜tool▁call▁end｜>{ws}<｜tool▁calls▁end｜>Done.',
    "kimi_k2": '{ws}<|tool_calls_section_begin|><|tool_call_begin|>functions.write_file:0'
               '<|tool_call_argument_begin|>{"path": "a"}{ws}<|tool_call_end|>{ws}'
               '<|tool_calls_section_end|>Done.',
    "json": '{ws}```json\n[{"name": "write_file", "arguments": {"path": "a"}},{ws}'
            '{"name": "write_file", "arguments": {"path": "a"}}{ws}]{ws}```{ws}Done.',
}


def blank_text(family: str, size: int) -> str:
    template = BLANK_RUNS[family]
    return template.replace("{ws}", "\n" * (size // template.count("{ws}")))


def cut(text: str, tokenizer) -> list[str]:
    if tokenizer is None:
        return [text[i:i + 4] for i in range(0, len(text), 4)]
    decoder = codecs.getincrementaldecoder("utf-8")()     # pieces may split a character
    pieces = (decoder.decode(tokenizer.piece(t)) for t in tokenizer.encode(text, add_special=False))
    return [p for p in pieces if p]


def parse_call(family: str, deltas: list) -> list:
    parser = OutputParser(None, build_tool_parser(family, ToolSet(SCHEMAS)))
    events = []
    for delta in deltas:
        events += parser.feed(delta)
    return events + parser.feed([Finish("stop", 1)])


def check(family: str, deltas: list, calls: list[dict]) -> None:
    """The stream is what the family writes: it parses to its calls."""
    ends = [e for e in parse_call(family, deltas) if isinstance(e, ToolCallEnd)]
    if [json.loads(e.arguments) for e in ends] != calls:
        raise SystemExit(f"{family}: the benchmark stream does not parse to its calls")


def stream_of(family: str, kb: int, blanks: bool, tokenizer) -> list:
    if blanks:
        text = blank_text(family, kb * 1024)
        calls = [{"path": "a"}] * BLANK_RUNS[family].count("write_file")
    else:
        content = source_text(kb * 1024)
        text, calls = call_text(family, content), [{"path": PATH, "content": content}]
    deltas = [[TextDelta(p)] for p in cut(text, tokenizer)]
    check(family, deltas, calls)
    return deltas


def cost_per_delta(family: str, deltas: list, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        parser = OutputParser(None, build_tool_parser(family, ToolSet(SCHEMAS)))
        for delta in deltas:
            parser.feed(delta)
        parser.feed([Finish("stop", 1)])
    return (time.perf_counter() - start) * 1e6 / (len(deltas) * calls)


def bench_family(family: str, sizes: list[int], repeat: int, tokenizer,
                 blanks: bool = False) -> dict[int, float]:
    most = max(sizes)
    streams = {kb: (stream_of(family, kb, blanks, tokenizer), max(1, round(most / kb)))
               for kb in sizes}
    runs: dict[int, list[float]] = {kb: [] for kb in sizes}
    for _ in range(repeat):                       # sizes interleaved: drift hits all alike
        for kb in sizes:
            runs[kb].append(cost_per_delta(family, *streams[kb]))
    return {kb: statistics.median(r) for kb, r in runs.items()}


def bench_calls(families: list[str], sizes: list[int], repeat: int, tokenizer,
                blanks: bool = False) -> dict:
    head = "".join(f"{f'{kb} KB':>10}" for kb in sizes)
    what = "a stream of N KB of blank runs" if blanks else "one call of N KB of arguments"
    print(f"per-delta cost of {what}, us (median of {repeat}); "
          f"ratio = {max(sizes)} KB / {min(sizes)} KB")
    print(f"{'family':<13}{head}{'ratio':>8}")
    results = {}
    for family in families:
        costs = bench_family(family, sizes, repeat, tokenizer, blanks)
        results[family] = costs
        cells = "".join(f"{costs[kb]:>10.2f}" for kb in sizes)
        print(f"{family:<13}{cells}{costs[max(sizes)] / costs[min(sizes)]:>8.2f}", flush=True)
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls-only", action="store_true", help="skip the mixed stream (part 1)")
    ap.add_argument("--stream-only", action="store_true", help="skip the per-family calls")
    ap.add_argument("--families", default=",".join(FAMILIES))
    ap.add_argument("--sizes", default="1,100,400", help="argument sizes in KB")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--tokens", action="store_true",
                    help="cut calls into the default model's tokens instead of 4 characters")
    ap.add_argument("--blanks", action="store_true",
                    help="part 3: blank runs where parsers wait, instead of big calls")
    ap.add_argument("--json", help="also write the figures to this file")
    opts = ap.parse_args()
    logging.getLogger("podium").setLevel(logging.ERROR)   # cut-short calls are expected here
    tokenizer = _tokenizer() if opts.tokens or not opts.calls_only else None
    out = {}
    if not opts.calls_only:
        out["stream"] = bench_stream(tokenizer)
    if not opts.stream_only:
        sizes = sorted(int(s) for s in opts.sizes.split(","))
        out["blanks" if opts.blanks else "calls"] = bench_calls(
            opts.families.split(","), sizes, opts.repeat, tokenizer if opts.tokens else None,
            opts.blanks)
    if opts.json:
        Path(opts.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
