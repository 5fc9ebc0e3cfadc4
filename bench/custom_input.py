"""A custom tool's input decoded while its arguments stream: cost per argument delta.

    .venv/bin/python bench/custom_input.py [--repeat 30]

One call whose input is N KB (1 and 100) of the standard library's ``json`` source (quotes,
backslashes, newlines), written as a JSON-argument family writes it (``{"input": "..."}``)
and fed in 4-character deltas to: ``CustomInput`` alone, ``ResponseBuilder`` rendering it as
a custom tool's call, and ``ResponseBuilder`` rendering the same arguments as a function's
call (the baseline). The figure is the best of ``--repeat`` runs divided by the deltas.
Target: flat in the size of the call.
"""

from __future__ import annotations

import argparse
import inspect
import itertools
import json
import time
from typing import Callable

from podium.api.responses.translate import ClientTool
from podium.parsing.events import ToolCallArgsDelta, ToolCallBegin, ToolCallEnd
from podium.render.custom_input import CustomInput
from podium.render.responses import ResponseBuilder, response_skeleton


def decoder(arguments: str, deltas: list[str]) -> None:
    d = CustomInput()
    for delta in deltas:
        d.feed(delta)
    d.rest(d.result(arguments))


def builder(kind: str) -> Callable[[str, list[str]], None]:
    def run(arguments: str, deltas: list[str]) -> None:
        ids = itertools.count()
        b = ResponseBuilder(response_skeleton(id="r", created_at=0.0, model="m"), None,
                            client_tool=lambda name: ClientTool(kind, name),
                            new_id=lambda prefix: f"{prefix}_{next(ids)}")
        b.event(0, ToolCallBegin(0, "call", "tool"))
        for delta in deltas:
            b.event(0, ToolCallArgsDelta(0, delta))
        b.event(0, ToolCallEnd(0, arguments))
    return run


def best(fn: Callable[[str, list[str]], None], arguments: str, deltas: list[str],
         repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn(arguments, deltas)
        times.append(time.perf_counter() - start)
    return min(times) / len(deltas) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=30)
    args = parser.parse_args()
    source = inspect.getsource(json) * 50
    for kb in (1, 100):
        arguments = json.dumps({"input": source[:kb * 1024]}, ensure_ascii=False)
        deltas = [arguments[i:i + 4] for i in range(0, len(arguments), 4)]
        for name, fn in (("CustomInput", decoder), ("builder, custom", builder("custom")),
                         ("builder, function", builder("function"))):
            print(f"{kb:>4} KB  {name:18} {best(fn, arguments, deltas, args.repeat):.3f} "
                  f"us per delta")


if __name__ == "__main__":
    main()
