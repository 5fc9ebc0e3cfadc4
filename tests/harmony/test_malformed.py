"""Malformed Harmony output (gpt-oss): recovered or dropped, never markup in the answer.

The policy is docs/parsing.md, "Malformed model output". Each case is what a model wrote
(special tokens written out, encoded to o200k_harmony's tokens) after a prompt ending in
``<|start|>assistant``; it is parsed token by token at several chunkings (1, 2, 7 tokens,
all at once), which must agree and keep the invariants: no special token in content or
reasoning, arguments a JSON object, calls only to declared tools, no exception.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from podium.engine.base import EngineOutput
from podium.harmony.format import Harmony
from podium.harmony.pipeline import HarmonyPipeline
from podium.parsing.events import (Finish, ReasoningDelta, TextDelta, ToolCallArgsDelta,
                                   ToolCallBegin, ToolCallEnd)
from podium.parsing.tools.base import ToolSet
from tests.harmony import harness as h

SCHEMAS = {"get_weather": {"type": "object", "properties": {"city": {"type": "string"}}},
           "get_time": {"type": "object"}}
STEPS = [None, 1, 2, 7]


@pytest.fixture(scope="module")
def harmony() -> Harmony:
    return Harmony()


def fold(events) -> tuple:
    content, reasoning, calls, args, finish = [], [], [], {}, None
    for e in events:
        if isinstance(e, TextDelta):
            content.append(e.text)
        elif isinstance(e, ReasoningDelta):
            reasoning.append(e.text)
        elif isinstance(e, ToolCallBegin):
            calls.append([e.name, None])
            args[e.index] = []
        elif isinstance(e, ToolCallArgsDelta):
            args[e.index].append(e.text)
        elif isinstance(e, ToolCallEnd):
            assert e.arguments == "".join(args[e.index])
            calls[e.index][1] = json.loads(e.arguments)
        elif isinstance(e, Finish):
            finish = e.reason
    return "".join(content), "".join(reasoning), [tuple(c) for c in calls], finish


def parse(harmony: Harmony, tokens: list[int], step: int | None) -> tuple:
    pipeline = HarmonyPipeline(harmony, ToolSet(SCHEMAS))
    events: list = []
    step = step or max(len(tokens), 1)
    for i in range(0, len(tokens), step):
        events += pipeline.feed(EngineOutput(tokens[i:i + step]))
        if pipeline.finished:
            break
    if not pipeline.finished:
        events += pipeline.feed(EngineOutput([], finish_reason="stop"))
    return fold(events)


def parse_all(harmony: Harmony, tokens: list[int]) -> tuple:
    whole = parse(harmony, tokens, None)
    content, reasoning, calls, _ = whole
    assert "<|" not in content and "<|" not in reasoning, whole
    for name, arguments in calls:
        assert name in SCHEMAS and isinstance(arguments, dict), whole
    for step in STEPS[1:]:
        assert parse(harmony, tokens, step) == whole, step
    return whole


def encode(text: str) -> list[int]:
    return h.encoding().encode(text, allowed_special="all")


CALL = "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
W = {"city": "Paris"}

# what the model wrote -> (content, reasoning, calls, finish)
CASES = [
    # a stray quote and brace after the arguments
    (CALL + '{"city": "Paris"}"}<|call|>', ("", "", [("get_weather", W)], "tool_calls")),
    # arguments cut by <|call|>, closed as valid JSON
    (CALL + '{"city": "Par<|call|>', ("", "", [("get_weather", {"city": "Par"})],
                                      "tool_calls")),
    # arguments that are no object: {}
    (CALL + '"Paris"<|call|>', ("", "", [("get_weather", {})], "tool_calls")),
    # a call to an undeclared function: dropped, nothing shown
    ("<|channel|>commentary to=functions.rm_rf <|constrain|>json<|message|>{}<|call|>",
     ("", "", [], "stop")),
    # the recipient without its functions. namespace, naming a declared tool
    ("<|channel|>commentary to=get_weather <|constrain|>json<|message|>"
     '{"city": "Paris"}<|call|>', ("", "", [("get_weather", W)], "tool_calls")),
    # an unknown channel: its text is the answer
    ("<|channel|>notes<|message|>Hello.<|end|>", ("Hello.", "", [], "stop")),
    # <|start|>assistant left out between two messages
    ("<|channel|>analysis<|message|>Think.<|end|><|channel|>final<|message|>Hi.<|return|>",
     ("Hi.", "Think.", [], "stop")),
    # <|start|>assistant written twice
    ("<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|start|>assistant"
     "<|channel|>final<|message|>Hi.<|return|>", ("Hi.", "Think.", [], "stop")),
    # garbage after <|end|>, then the next message
    ("<|channel|>final<|message|>Hi<|end|>stray text<|start|>assistant<|channel|>final"
     "<|message|> there.<|return|>", ("Hi there.", "", [], "stop")),
    # the output cut inside a call's header, and inside its arguments
    ("<|channel|>analysis<|message|>x<|end|><|start|>assistant<|channel|>commentary to=func",
     ("", "x", [], "stop")),
    (CALL + '{"city": "Pa', ("", "", [("get_weather", {"city": "Pa"})], "tool_calls")),
]


@pytest.mark.parametrize("text, expected", CASES)
def test_malformed_harmony(harmony, text, expected):
    assert parse_all(harmony, encode(text)) == expected


# -- the property: mutate a valid turn's tokens, keep the invariants -----------------------

SPECIAL = ["<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|call|>",
           "<|return|>"]
TURN = h.completion(h.analysis("Need the weather."), h.preamble("Checking."),
                    h.call("get_weather", '{"city": "Paris"}'), h.call("get_time", "{}"))
MUTATION = st.tuples(st.sampled_from(["drop", "double", "swap", "insert", "cut"]),
                     st.integers(min_value=0), st.sampled_from(['"', "}", "{", "]", "'"]))


def mutate(tokens: list[int], mutation) -> list[int]:
    kind, at, char = mutation
    special = set(encode("".join(SPECIAL)))
    where = [i for i, t in enumerate(tokens) if t in special]
    if kind == "insert":
        i = at % (len(tokens) + 1)
        return tokens[:i] + encode(char) + tokens[i:]
    if kind == "cut":
        return tokens[:at % (len(tokens) + 1)]
    if not where:
        return tokens
    i = where[at % len(where)]
    if kind == "drop":
        return tokens[:i] + tokens[i + 1:]
    if kind == "double":
        return tokens[:i] + [tokens[i]] + tokens[i:]
    later = [j for j in where if j > i]
    if not later:
        return tokens
    j = later[0]
    out = list(tokens)
    out[i], out[j] = out[j], out[i]
    return out


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.function_scoped_fixture])
@given(st.lists(MUTATION, min_size=1, max_size=2))
def test_mutated_turns_keep_the_invariants(harmony, mutations):
    tokens = list(TURN)
    for mutation in mutations:
        tokens = mutate(tokens, mutation)
    parse_all(harmony, tokens)
