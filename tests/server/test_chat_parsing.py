"""Reasoning and tool calls through the chat API (scripted engine, real tokenizer)."""

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from podium.engine.base import ModelInfo
from podium.engine.scripted import ScriptedEngine
from tests.conftest import SERVED
from tests.server.sse import events

URL = "/v1/chat/completions"
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}},
         {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}]
THINK_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m.role }}\n"
                  "{% if m.reasoning_content %}<think>{{ m.reasoning_content }}</think>{% endif %}"
                  "{{ m.content }}<|im_end|>\n{% endfor %}<|im_start|>assistant\n"
                  "{% if enable_thinking is defined and not enable_thinking %}"
                  "<think>\n\n</think>\n\n{% endif %}")
REPLY = ('<think>The user wants weather.</think>\nChecking both.<tool_call>\n{"name": '
         '"get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n<tool_call>\n'
         '{"name": "get_time", "arguments": {}}\n</tool_call>')


def thinking_engine(tokenizer, reply, template=None, **pacing):
    template = template or THINK_TEMPLATE + "{# <tool_call> #}"
    return ScriptedEngine(tokenizer, ModelInfo(SERVED, 4096, template, 0), [reply], **pacing)


def ask(**extra):
    return {"model": SERVED, "messages": [{"role": "user", "content": "Weather and time?"}],
            "tools": TOOLS, **extra}


def fold_stream(chunks):
    """Fold raw chunks the way a client does, checking the streaming contract."""
    content, reasoning, calls, finish = "", "", {}, None
    for raw in chunks:
        chunk = ChatCompletionChunk.model_validate(raw)
        if not chunk.choices:
            continue
        delta, choice = raw["choices"][0]["delta"], chunk.choices[0]
        assert delta.get("tool_calls") != []              # never an empty tool_calls array
        assert not ("tool_calls" in delta and delta.get("content"))
        content += delta.get("content") or ""
        reasoning += delta.get("reasoning_content") or ""
        for d in delta.get("tool_calls") or ():
            if d["index"] not in calls:
                assert d["id"] and d["type"] == "function" and d["function"]["name"]
                calls[d["index"]] = [d["function"]["name"], d["function"]["arguments"]]
            else:
                assert "id" not in d and "name" not in d["function"]
                calls[d["index"]][1] += d["function"]["arguments"]
        finish = choice.finish_reason or finish
    return content, reasoning, [tuple(calls[i]) for i in sorted(calls)], finish


def fold_message(body):
    ChatCompletion.model_validate(body)
    choice = body["choices"][0]
    m = choice["message"]
    calls = [(c["function"]["name"], c["function"]["arguments"]) for c in m.get("tool_calls") or ()]
    return m["content"] or "", m.get("reasoning_content") or "", calls, choice["finish_reason"]


def test_reasoning_text_and_calls(tokenizer, client_for):
    c = client_for(thinking_engine(tokenizer, REPLY))
    whole = fold_message(c.post(URL, json=ask()).json())
    assert whole == ("Checking both.", "The user wants weather.",
                     [("get_weather", '{"city": "Paris"}'), ("get_time", "{}")], "tool_calls")
    assert fold_stream(events(c.post(URL, json=ask(stream=True)).text)) == whole


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.integers(min_value=1, max_value=8))
def test_any_tokens_per_step_folds_to_the_non_stream_message(tokenizer, client_for, step):
    # (the fixtures only build objects; nothing carries over between examples)
    c = client_for(thinking_engine(tokenizer, REPLY, tokens_per_step=step))
    streamed = fold_stream(events(c.post(URL, json=ask(stream=True)).text))
    assert streamed == fold_message(c.post(URL, json=ask()).json())


def test_arguments_stream_as_they_are_generated(tokenizer, client_for):
    long_args = json.dumps({"city": "Paris " * 30})
    reply = f'<tool_call>{{"name": "get_weather", "arguments": {long_args}}}</tool_call>'
    c = client_for(thinking_engine(tokenizer, reply))
    chunks = events(c.post(URL, json=ask(stream=True)).text)
    arg_chunks = [ch for ch in chunks if ch["choices"] and "tool_calls" in ch["choices"][0]["delta"]]
    assert len(arg_chunks) > 20


def test_cut_mid_call_is_length_with_valid_json(tokenizer, client_for):
    c = client_for(thinking_engine(tokenizer, REPLY))
    for stream in (False, True):
        r = c.post(URL, json=ask(max_tokens=30, stream=stream))
        content, _, calls, finish = (fold_stream(events(r.text)) if stream
                                     else fold_message(r.json()))
        assert finish == "length"
        for _, arguments in calls:
            json.loads(arguments)


def test_enable_thinking_false_closes_the_reasoning_of_a_model_that_thinks_anyway(
        tokenizer, client_for):
    """Thinking off is a reasoning budget of 0: the engine closes the <think> the model
    opens regardless, and the answer is what follows the model's own end of thinking."""
    c = client_for(thinking_engine(tokenizer, "<think>x</think>answer"))
    body = c.post(URL, json=ask(chat_template_kwargs={"enable_thinking": False})).json()
    assert body["choices"][0]["message"]["content"] == "answer"
    assert "reasoning_content" not in body["choices"][0]["message"]


def test_prompt_that_opened_think(tokenizer, client_for):
    template = "{% for m in messages %}{{ m.content }}{% endfor %}<|im_start|>assistant\n<think>\n"
    c = client_for(thinking_engine(tokenizer, "pondering</think>42", template))
    m = c.post(URL, json=ask(tools=None)).json()["choices"][0]["message"]
    assert (m["reasoning_content"], m["content"]) == ("pondering", "42")


def test_reasoning_field_option(tokenizer, client_for):
    for field, keys in (("reasoning", {"reasoning"}),
                        ("both", {"reasoning", "reasoning_content"})):
        c = client_for(thinking_engine(tokenizer, "<think>hm</think>ok"), reasoning_field=field)
        m = c.post(URL, json=ask(tools=None)).json()["choices"][0]["message"]
        assert {k for k in m if k.startswith("reasoning")} == keys
        chunks = events(c.post(URL, json=ask(tools=None, stream=True)).text)
        assert any(keys <= set(ch["choices"][0]["delta"]) for ch in chunks if ch["choices"])


def test_incoming_reasoning_reaches_the_template(tokenizer, client_for):
    engine = thinking_engine(tokenizer, "ok")
    history = [{"role": "user", "content": "hi"},
               {"role": "assistant", "content": "hello", "reasoning": "be nice"},
               {"role": "user", "content": "again"}]
    client_for(engine).post(URL, json={"model": SERVED, "messages": history})
    assert "<think>be nice</think>hello" in tokenizer.decode(engine.requests[0].prompt_token_ids)


def test_undeclared_tool_call_is_dropped_markup_and_all(tokenizer, client_for):
    # docs/parsing.md, "Malformed model output": a call to a tool the request did not
    # declare is dropped with a warning; its markup never reaches the content
    reply = 'Sure.<tool_call>{"name": "launch_rockets", "arguments": {}}</tool_call>'
    c = client_for(thinking_engine(tokenizer, reply))
    m = c.post(URL, json=ask()).json()["choices"][0]
    assert m["message"]["content"] == "Sure." and m["finish_reason"] == "stop"
    assert not m["message"].get("tool_calls")
    streamed = "".join(chunk["choices"][0]["delta"].get("content") or ""
                       for chunk in events(c.post(URL, json=ask(stream=True)).text)
                       if chunk.get("choices"))
    assert streamed == "Sure."


def test_without_tools_markup_is_content(tokenizer, client_for):
    c = client_for(thinking_engine(tokenizer, REPLY))
    m = c.post(URL, json=ask(tools=None)).json()["choices"][0]["message"]
    assert "<tool_call>" in m["content"] and "tool_calls" not in m


def test_forced_calls_send_a_grammar(scripted, client_for):
    engine = scripted(['<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'])
    c = client_for(engine)
    r = c.post(URL, json=ask(tool_choice={"type": "function", "function": {"name": "get_time"}}))
    assert r.json()["choices"][0]["finish_reason"] == "stop"
    grammar = engine.requests[-1].sampling.grammar
    assert grammar.startswith("start: podium_one\n")
    assert 'podium_call: "{\\"name\\": \\"get_time\\", \\"arguments\\": " %json' in grammar
    assert "<tool_call>" in grammar.splitlines()[-1]     # the model's special token
    c.post(URL, json=ask(tool_choice="required", parallel_tool_calls=False))
    assert "get_weather" in engine.requests[-1].sampling.grammar
    c.post(URL, json=ask(tools=None, response_format={"type": "json_object"}))
    assert "object" in engine.requests[-1].sampling.grammar
    c.post(URL, json=ask())
    assert engine.requests[-1].sampling.grammar is None


@pytest.mark.parametrize("stream", [False, True])
def test_a_reasoning_budget_holds_every_choice_with_logprobs(tokenizer, client_for, stream):
    """n choices each keep their own budget; logprobs cover the engine's close like any
    token; streamed and not alike."""
    reply = "<think>one two three four five six seven eight</think>The answer."
    c = client_for(thinking_engine(tokenizer, reply))
    body = ask(tools=None, n=2, logprobs=True, thinking_token_budget=3, stream=stream)
    r = c.post(URL, json=body)
    assert r.status_code == 200, r.text
    if stream:
        choices = {}
        for chunk in events(r.text):
            for ch in chunk["choices"]:
                got = choices.setdefault(ch["index"], {"reasoning": "", "content": ""})
                got["reasoning"] += ch["delta"].get("reasoning_content") or ""
                got["content"] += ch["delta"].get("content") or ""
        answers = [choices[i] for i in sorted(choices)]
    else:
        answers = [{"reasoning": ch["message"].get("reasoning_content") or "",
                    "content": ch["message"]["content"]} for ch in r.json()["choices"]]
        for ch in r.json()["choices"]:
            assert ch["logprobs"] is not None
    assert len(answers) == 2
    for got in answers:
        assert len(tokenizer.encode(got["reasoning"].strip(), add_special=False)) == 3
        assert got["content"].strip() == "The answer."
