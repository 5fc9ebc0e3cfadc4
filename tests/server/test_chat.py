"""Chat Completions through the real app on the scripted engine, checked against openai's types."""

from openai.types.chat import ChatCompletion, ChatCompletionChunk

from tests.conftest import SERVED
from tests.server.sse import events
from tests.server.apps import served

URL = "/v1/chat/completions"


def ask(**extra):
    return {"model": SERVED, "messages": [{"role": "user", "content": "Hi"}], **extra}


def test_non_stream_answer_is_a_valid_chat_completion(client):
    r = client.post(URL, json=ask())
    assert r.status_code == 200
    completion = ChatCompletion.model_validate(r.json())
    assert completion.choices[0].message.content == "Hello there, how can I help?"
    assert completion.choices[0].finish_reason == "stop"
    assert completion.usage.completion_tokens == len(
        served(client.app).engine.tokenizer.encode("Hello there, how can I help?",
                                                 add_special=False)) + 1   # + end of turn


def test_prompt_is_the_model_template_and_usage_counts_it(scripted, client_for):
    engine = scripted(["ok"])
    r = client_for(engine).post(URL, json=ask(messages=[
        {"role": "developer", "content": [{"type": "text", "text": "Be"}, {"type": "text", "text": "brief"}]},
        {"role": "user", "content": "Hi"}]))
    sent = engine.requests[0].prompt_token_ids
    assert sent == engine.tokenizer.encode(
        "<|im_start|>system\nBe\nbrief<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\n")
    assert r.json()["usage"]["prompt_tokens"] == len(sent)


def test_stream_chunks_are_valid_and_fold_to_the_non_stream_answer(client):
    body = client.post(URL, json=ask(stream=True, stream_options={"include_usage": True})).text
    chunks = [ChatCompletionChunk.model_validate(e) for e in events(body)]
    assert len({(c.id, c.created, c.model) for c in chunks}) == 1
    assert chunks[0].choices[0].delta.role == "assistant"
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert content == client.post(URL, json=ask()).json()["choices"][0]["message"]["content"]
    finishes = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finishes) == 1 and finishes[0].choices[0].finish_reason == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens > 0
    assert all(not c.choices or c.choices[0].delta.tool_calls is None for c in chunks)


def test_n_choices_stream_each_with_role_and_one_finish(scripted, client_for):
    c = client_for(scripted(["one", "two", "three"]))
    chunks = [ChatCompletionChunk.model_validate(e)
              for e in events(c.post(URL, json=ask(n=3, stream=True)).text)]
    for i in range(3):
        mine = [ch.choices[0] for ch in chunks if ch.choices and ch.choices[0].index == i]
        assert mine[0].delta.role == "assistant"
        assert sum(1 for ch in mine if ch.finish_reason) == 1
    folded = c.post(URL, json=ask(n=3)).json()
    assert [ch["message"]["content"] for ch in folded["choices"]] == ["one", "two", "three"]


def test_stop_string_across_tokens_cuts_and_finishes_stop(scripted, client_for):
    c = client_for(scripted(["The answer is 42. Goodbye and thanks"]))
    r = c.post(URL, json=ask(stop=["Good", "zzz"]))
    assert r.json()["choices"][0]["message"]["content"] == "The answer is 42. "
    assert r.json()["choices"][0]["finish_reason"] == "stop"
    chunks = events(c.post(URL, json=ask(stop="bye", stream=True)).text)
    text = "".join(ch["choices"][0]["delta"].get("content", "") for ch in chunks)
    assert text == "The answer is 42. Good"


def test_max_tokens_gives_length_and_exact_usage(client):
    for field in ("max_tokens", "max_completion_tokens"):
        r = client.post(URL, json=ask(**{field: 3})).json()
        assert r["choices"][0]["finish_reason"] == "length"
        assert r["usage"]["completion_tokens"] == 3


def test_sampling_fields_reach_the_engine(scripted, client_for):
    engine = scripted(["ok"])
    client_for(engine).post(URL, json=ask(
        temperature=0.3, top_p=0.9, seed=7, presence_penalty=0.5, frequency_penalty=-0.5,
        logit_bias={"15": 5}, max_tokens=9, user="u1", top_k=5, min_p=0.1))
    s = engine.requests[0].sampling
    assert (s.temperature, s.top_p, s.seed, s.presence_penalty, s.frequency_penalty) == (
        0.3, 0.9, 7, 0.5, -0.5)
    assert (s.logit_bias, s.max_tokens, s.top_k, s.min_p) == ({15: 5.0}, 9, 5, 0.1)


def test_seeded_choices_get_distinct_seeds(scripted, client_for):
    engine = scripted(["ok"])
    client_for(engine).post(URL, json=ask(n=2, seed=10))
    assert [r.sampling.seed for r in engine.requests] == [10, 11]


def test_logprobs_shape(client):
    r = client.post(URL, json=ask(logprobs=True, top_logprobs=1)).json()
    ChatCompletion.model_validate(r)
    content = r["choices"][0]["logprobs"]["content"]
    assert "".join(e["token"] for e in content) == "Hello there, how can I help?"
    assert all(len(e["top_logprobs"]) == 1 for e in content)
    chunks = events(client.post(URL, json=ask(logprobs=True, stream=True)).text)
    streamed = [e for ch in chunks for e in ((ch["choices"][0].get("logprobs") or {}).get("content") or [])]
    assert [e["token"] for e in streamed] == [e["token"] for e in content]


def test_assistant_tool_calls_in_history_reach_the_template(scripted, client_for):
    engine = scripted(["It is sunny."])
    r = client_for(engine).post(URL, json=ask(messages=[
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function",
         "function": {"name": "weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"}],
        tools=[{"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}]))
    assert r.status_code == 200
    prompt = engine.tokenizer.decode(engine.requests[0].prompt_token_ids)
    assert '{"name": "weather", "arguments": {"city": "Paris"}}' in prompt
    assert "<tool_response>\nsunny\n</tool_response>" in prompt
    assert '"name": "weather"' in prompt.split("\n</tools>")[0]
