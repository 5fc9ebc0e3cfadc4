"""Vectors for each model family (our own strings, written from the formats)."""

import pytest

from tests.parsing.helpers import parse

W = {"city": "Paris"}

CASES = {
    "hermes": [
        ('Sure.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
         "Sure.", [("get_weather", W)]),
        ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
         '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>',
         "", [("get_weather", W), ("get_time", {})]),
        ('<tool_call>{"arguments": {"city": "Paris"}, "name": "get_weather"}</tool_call>',
         "", [("get_weather", W)]),
        ('<tool_call>{"name": "get_time"}</tool_call>', "", [("get_time", {})]),
        ('<tool_call>{"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\"}"}</tool_call>',
         "", [("get_weather", W)]),
        # markup never reaches content (docs/parsing.md, "Malformed model output")
        ("Write <tool_call> tags around calls.", "Write  tags around calls.", []),
        ('<tool_call>\n{"name": "rm_rf", "arguments": {}}\n</tool_call>', "", []),
        ('<tool_call>{"name": "get_weather", "arguments": {"city": "</tool_call>"}}</tool_call>',
         "", [("get_weather", {"city": "</tool_call>"})]),
    ],
    "qwen3_coder": [
        ("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
         "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>",
         "", [("get_weather", {"city": "Paris", "days": 3})]),
        ('Writing.\n<tool_call>\n<function=write_file>\n<parameter=path>\na.py\n</parameter>\n'
         '<parameter=content>\nx = "</parameter>"\n<b>bold</b>\n</parameter>\n'
         '<parameter=mode>\n{"a": [1, 2]}\n</parameter>\n<parameter=force>\nTrue\n</parameter>\n'
         '</function>\n</tool_call>',
         "Writing.", [("write_file", {"path": "a.py", "content": 'x = "</parameter>"\n<b>bold</b>',
                                      "mode": {"a": [1, 2]}, "force": True})]),
        ("<tool_call>\n<function=get_time>\n</function>\n</tool_call>", "", [("get_time", {})]),
        ("<tool_call>\n<function=nope>\n</function>\n</tool_call>", "", []),
    ],
    "glm45": [
        ("<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n"
         "<arg_key>days</arg_key>\n<arg_value>2</arg_value>\n</tool_call>",
         "", [("get_weather", {"city": "Paris", "days": 2})]),
        ("Hmm.<tool_call>get_time\n</tool_call>", "Hmm.", [("get_time", {})]),
    ],
    "llama3_json": [
        ('{"name": "get_weather", "parameters": {"city": "Paris"}}', "", [("get_weather", W)]),
        ('<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}; '
         '{"name": "get_time", "parameters": {}}', "", [("get_weather", W), ("get_time", {})]),
        ('{"a": 1} is a JSON object.', '{"a": 1} is a JSON object.', []),
        ("The answer is 4.", "The answer is 4.", []),
    ],
    "pythonic": [
        ('[get_weather(city="Paris", days=2), get_time()]', "",
         [("get_weather", {"city": "Paris", "days": 2}), ("get_time", {})]),
        ("[1, 2, 3] is a list.", "[1, 2, 3] is a list.", []),
    ],
    "mistral": [
        ('[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}, '
         '{"name": "get_time", "arguments": {}}]', "", [("get_weather", W), ("get_time", {})]),
        ('[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_time[ARGS]{}', "",
         [("get_weather", W), ("get_time", {})]),
        ('Let me look.[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}', "Let me look.",
         [("get_weather", W)]),
    ],
    "deepseek_v3": [
        ('<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n'
         '{"city": "Paris"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>', "", [("get_weather", W)]),
        ('Checking.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris"}'
         '<｜tool▁call▁end｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{}<｜tool▁call▁end｜>'
         '<｜tool▁calls▁end｜>', "Checking.", [("get_weather", W), ("get_time", {})]),
    ],
    "kimi_k2": [
        ('<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0'
         '<|tool_call_argument_begin|>{"city": "Paris"}<|tool_call_end|><|tool_call_begin|>'
         'functions.get_time:1<|tool_call_argument_begin|>{}<|tool_call_end|>'
         '<|tool_calls_section_end|>', "", [("get_weather", W), ("get_time", {})]),
    ],
    "json": [
        ('```json\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n```', "",
         [("get_weather", W)]),
        ('{"name": "get_weather", "arguments": {"city": "Paris"}}', "", [("get_weather", W)]),
        ('[{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "get_time", '
         '"arguments": {}}]', "", [("get_weather", W), ("get_time", {})]),
        ('```python\nprint("hi")\n```', '```python\nprint("hi")\n```', []),
        ('{"name": "Bob", "age": 3}', '{"name": "Bob", "age": 3}', []),
    ],
}


@pytest.mark.parametrize("family, text, content, calls", [
    (family, *case) for family, cases in CASES.items() for case in cases])
@pytest.mark.parametrize("sizes", [None, [1], [2, 5, 1, 9], [40]])
def test_family_vectors(family, text, content, calls, sizes):
    out = parse(text, sizes, tool_family=family)
    assert out.content == content
    assert out.calls == calls
    assert out.finish == ("tool_calls" if calls else "stop")


def test_hermes_family_also_accepts_the_json_fallback():
    out = parse('```json\n{"name": "get_time", "arguments": {}}\n```', [3], tool_family="hermes")
    assert out.calls == [("get_time", {})] and out.content == ""


@pytest.mark.parametrize("reasoning, text", [
    ("think", "<think>Let me think.</think>\n\nThe answer is 4."),
    ("mistral", "[THINK]Let me think.[/THINK]The answer is 4."),
])
def test_reasoning_is_split_off(reasoning, text):
    for sizes in (None, [1], [3, 7]):
        out = parse(text, sizes, tool_family=None, reasoning=reasoning)
        assert (out.reasoning, out.content) == ("Let me think.", "The answer is 4.")


def test_template_that_opened_think_in_the_prompt():
    prompt = "<|im_start|>assistant\n<think>\n"
    out = parse("Hmm, 2+2.\n</think>\n\n4", [2], tool_family=None, reasoning="think",
                prompt=prompt)
    assert (out.reasoning, out.content) == ("Hmm, 2+2.\n", "4")


def test_think_tag_in_the_middle_is_content():
    out = parse("Use <think> tags.", [1], tool_family=None, reasoning="think")
    assert out.content == "Use <think> tags." and out.reasoning == ""


def test_reasoning_then_calls():
    text = ('<think>Need weather.</think>\n<tool_call>\n{"name": "get_weather", "arguments": '
            '{"city": "Paris"}}\n</tool_call>')
    out = parse(text, [2], reasoning="think")
    assert out.reasoning == "Need weather." and out.calls == [("get_weather", W)]
    assert out.content == ""


def test_named_tool_choice_finishes_with_stop():
    out = parse('<tool_call>{"name": "get_time", "arguments": {}}</tool_call>', named=True)
    assert out.finish == "stop" and out.calls == [("get_time", {})]


def test_parallel_false_keeps_one_call():
    text = ('<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
            '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>')
    assert parse(text, [3], max_calls=1).calls == [("get_weather", W)]


def test_cut_mid_call_closes_valid_json_and_keeps_length():
    from tests.parsing.helpers import fold, parser, run
    out = fold(run(parser(), cut_text := ['<tool_call>{"name": "get_weather", "arguments": '
                                          '{"city": "Par'], finish="length"))
    assert out.calls == [("get_weather", {"city": "Par"})] and out.finish == "length"
    assert cut_text


@pytest.mark.parametrize("broken", [
    '<tool_call>{"name": "get_weather", "arguments": {"city": }}</tool_call>',
    '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"} oops</tool_call>',
    '<tool_call>{"nam',
    '<tool_call>not json at all</tool_call>',
])
def test_malformed_calls_never_raise(broken):
    for sizes in (None, [1], [4]):
        out = parse(broken, sizes)
        for name, args in out.calls:
            assert name == "get_weather" and isinstance(args, dict)
        assert "<tool_call>" not in out.content and "</tool_call>" not in out.content


def test_fallback_reads_objects_one_after_another():
    text = ('\n{"name": "get_time", "arguments": {}}\n'
            '{"name": "get_weather", "arguments": {"city": "Paris"}}')
    for sizes in (None, [1], [5]):
        out = parse(text, sizes, tool_family="hermes")
        assert out.calls == [("get_time", {}), ("get_weather", W)] and out.content == ""


@pytest.mark.parametrize("family, text, content, calls", [
    # a raw control character in a key: not JSON (json.loads used to raise out of the parser)
    ("hermes", '<tool_call>{"name": "get_weather", "ci\nty": "Paris"}</tool_call>',
     "", [("get_weather", {})]),
    ("hermes", '<tool_call>{"na\nme": "get_time"}</tool_call>', "", []),
    # a bad escape: closed before the backslash (no invented character: it was closed as
    # "\n" before issue 26, as \", an unterminated string, before that)
    ("mistral", '[TOOL_CALLS]get_weather[ARGS]{"city": "Par\\\nis"}', "",
     [("get_weather", {"city": "Par"})]),
    # a later object in the list that is no call is dropped, however the text is cut
    ("json", '[{"name": "get_time", "arguments": {}}, {"name": "get_\tweather", '
     '"arguments": {}}] Done.', " Done.", [("get_time", {})]),
    # Python literals that are not JSON: not a call list
    ("pythonic", '[get_weather(city=b"Paris")]', '[get_weather(city=b"Paris")]', []),
    ("pythonic", "[get_weather(days=1e999)]", "[get_weather(days=1e999)]", []),
])
@pytest.mark.parametrize("sizes", [None, [1], [2, 5, 1, 9]])
def test_malformed_json_never_raises_and_closes_as_valid_json(family, text, content, calls,
                                                               sizes):
    out = parse(text, sizes, tool_family=family)
    assert (out.content, out.calls) == (content, calls)
