"""Concurrent requests and prefix reuse through the real server, as the openai SDK sees them."""

from concurrent.futures import ThreadPoolExecutor

from tests.e2e.conftest import MODEL

QUESTIONS = ["Name three rivers.", "What is a linked list?", "Say hi in Spanish.",
             "Give one tip for sleeping well.", "What colour is the sky at dusk?"]
# long enough to fill several prefill chunks (--batch-size 128), so a second request reuses them
SYSTEM = "You are a terse assistant for a hardware store. " + " ".join(
    f"Rule {i}: answer in one short sentence and never mention competitor number {i}."
    for i in range(40))


def ask(client, question, seed):
    r = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": question}], max_tokens=24,
        temperature=0.8, seed=seed)
    return r.choices[0].message.content, r.choices[0].finish_reason


def test_concurrent_requests_answer_as_they_do_alone(client):
    alone = [ask(client, q, seed=i) for i, q in enumerate(QUESTIONS)]
    with ThreadPoolExecutor(len(QUESTIONS)) as pool:      # more requests than sequences
        together = list(pool.map(lambda a: ask(client, *a),
                                 [(q, i) for i, q in enumerate(QUESTIONS)]))
    assert together == alone
    assert all(text and finish in ("stop", "length") for text, finish in together)


def test_a_shared_prefix_is_reported_as_cached_tokens(client):
    def chat(question):
        return client.chat.completions.create(
            model=MODEL, max_tokens=4, temperature=0,
            messages=[{"role": "system", "content": SYSTEM},
                      {"role": "user", "content": question}])

    first = chat("Do you sell hammers?")
    assert first.usage.prompt_tokens > 512
    second = chat("Do you sell nails?")
    cached = second.usage.prompt_tokens_details.cached_tokens
    # whole 128-token chunks of the shared system prompt, never the part that differs
    assert cached % 128 == 0 and second.usage.prompt_tokens - 128 - 16 < cached
    assert cached < second.usage.prompt_tokens
    response = client.responses.create(model=MODEL, instructions=SYSTEM,
                                       input="Do you sell glue?", max_output_tokens=16)
    assert response.usage.input_tokens_details.cached_tokens == cached
