"""``max_output_tokens`` bounds a whole response, across its MCP rounds (as OpenAI's does):
each round of the model is given what the rounds before it left, a round that runs out ends
the response ``incomplete`` without running the call it was writing, and the usage is every
round's. Scripted engine, real MCP server (``tests/server/test_mcp.py``'s)."""

from __future__ import annotations

from podium.api.responses.runner import MAX_ROUNDS
from tests.server.responses_check import check_stream, sse_events
from tests.server.test_mcp import URL, app, ask, call, mcp_url  # noqa: F401 - fixtures
from tests.server.test_responses import app_for  # noqa: F401 - the fixture under ``app``

KEEPS_CALLING = call("add", a=1, b=1)       # a model that calls the tool every round


def round_tokens(engine) -> int:
    """The tokens of one whole round of the script: its reply and the end of turn."""
    return len(engine.tokenizer.encode(KEEPS_CALLING, add_special=False)) + 1


def test_rounds_share_max_output_tokens(app, mcp_url):  # noqa: F811
    c = app([KEEPS_CALLING])
    limit = 96
    body = c.post(URL, json=ask(mcp_url, max_output_tokens=limit)).json()
    per_round = round_tokens(c.engine)
    whole = limit // per_round          # rounds that fit; the next one is cut
    assert 0 < whole < MAX_ROUNDS - 1 and limit % per_round
    budgets = [r.sampling.max_tokens for r in c.engine.requests]
    assert budgets == [limit - i * per_round for i in range(whole + 1)]
    assert body["status"] == "incomplete"
    assert body["incomplete_details"] == {"reason": "max_output_tokens"}
    assert body["usage"]["output_tokens"] == limit      # every round's, no more than asked
    assert body["usage"]["input_tokens"] == sum(len(r.prompt_token_ids)
                                                for r in c.engine.requests)
    calls = [i for i in body["output"] if i["type"] == "mcp_call"]
    assert [(i["status"], i.get("output")) for i in calls] == (
        [("completed", "2")] * whole + [("incomplete", None)])   # the cut one is not run


def test_the_stream_ends_the_same_way(app, mcp_url):  # noqa: F811
    c = app([KEEPS_CALLING])
    limit = 2 * round_tokens(c.engine) + 18            # the third call is cut
    events = sse_events(c.post(URL, json=ask(mcp_url, max_output_tokens=limit,
                                             stream=True)).text)
    final = check_stream(events)
    assert events[-1]["type"] == "response.incomplete"
    assert final["usage"]["output_tokens"] == limit
    kinds = [e["type"] for e in events]
    assert kinds.count("response.mcp_call.completed") == 2
    assert kinds.count("response.mcp_call.in_progress") == 2
    assert final["output"][-1]["type"] == "mcp_call"
    assert final["output"][-1]["status"] == "incomplete"


def test_a_response_that_spends_its_tokens_exactly_runs_no_more_rounds(app, mcp_url):  # noqa: F811
    """The second round ends of itself on the last token left: its whole call runs, and
    the response ends there, incomplete (no round of 0 tokens is started)."""
    c = app([KEEPS_CALLING])
    per_round = round_tokens(c.engine)
    body = c.post(URL, json=ask(mcp_url, max_output_tokens=2 * per_round)).json()
    assert [r.sampling.max_tokens for r in c.engine.requests] == [2 * per_round, per_round]
    calls = [i for i in body["output"] if i["type"] == "mcp_call"]
    assert [(i["status"], i["output"]) for i in calls] == [("completed", "2")] * 2
    assert body["status"] == "incomplete"
    assert body["incomplete_details"] == {"reason": "max_output_tokens"}
    assert body["usage"]["output_tokens"] == 2 * per_round


def test_without_a_limit_each_round_has_the_context_left(app, mcp_url):  # noqa: F811
    c = app([KEEPS_CALLING, "Two."])
    body = c.post(URL, json=ask(mcp_url)).json()
    assert body["status"] == "completed" and body["max_output_tokens"] is None
    for request in c.engine.requests:
        assert request.sampling.max_tokens == 4096 - len(request.prompt_token_ids)
