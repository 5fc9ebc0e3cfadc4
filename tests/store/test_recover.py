"""``recover``: a logged Responses stream, cut anywhere, folded back into output items."""

import copy
import itertools

import pytest

from podium.api.responses.translate import ClientTool
from podium.parsing.events import (Finish, ReasoningDelta, TextDelta, ToolCallArgsDelta,
                                   ToolCallBegin, ToolCallEnd, Usage)
from podium.render.responses import ResponseBuilder, Sequencer, recover, response_skeleton
from tests.server.responses_check import check_stream

DELTAS = ("response.output_text.delta", "response.reasoning_text.delta",
          "response.function_call_arguments.delta", "response.custom_tool_call_input.delta")


def logged_stream() -> tuple[list[dict], list[dict]]:
    """A whole stream (reasoning, text, a function call, a custom call) and its output."""
    counter = itertools.count()
    tools = {"get_weather": ClientTool("function", "get_weather"),
             "apply_patch": ClientTool("custom", "apply_patch")}
    builder = ResponseBuilder(response_skeleton(id="resp_1", created_at=0.0, model="m"), None,
                              client_tool=tools.__getitem__,
                              new_id=lambda prefix: f"{prefix}_{next(counter)}")
    events = builder.open()
    for e in [ReasoningDelta("Need "), ReasoningDelta("the weather."),
              TextDelta("It is "), TextDelta("sunny "), TextDelta("in Paris."),
              ToolCallBegin(0, "call_1", "get_weather"), ToolCallArgsDelta(0, '{"city": '),
              ToolCallArgsDelta(0, '"Paris"}'), ToolCallEnd(0, '{"city": "Paris"}'),
              ToolCallBegin(1, "call_2", "apply_patch"),
              ToolCallArgsDelta(1, '{"input": "*** pa'), ToolCallArgsDelta(1, 'tch\\n"}'),
              ToolCallEnd(1, '{"input": "*** patch\\n"}')]:
        events += builder.event(0, e)
    builder.event(0, Finish("tool_calls", 12))
    events += builder.close(Usage(3, 12))
    return events, builder.response["output"]


def test_a_whole_log_gives_the_output_it_streamed():
    events, output = logged_stream()
    assert recover(events) == (output, [])
    assert output[-1]["input"] == "*** patch\n"        # decoded from the arguments


def test_an_item_cut_mid_text():
    events, _ = logged_stream()
    second = next(i for i, e in enumerate(events) if e.get("delta") == "sunny ")
    output, closing = recover(events[:second + 1])
    reasoning, message = output
    assert reasoning["status"] == "completed"
    assert reasoning["content"] == [{"type": "reasoning_text", "text": "Need the weather."}]
    assert message["status"] == "incomplete"
    assert message["content"] == [{"type": "output_text", "text": "It is sunny ",
                                   "annotations": [], "logprobs": []}]
    assert [e["type"] for e in closing] == ["response.output_text.done",
                                            "response.content_part.done",
                                            "response.output_item.done"]
    assert closing[-1]["item"] == message and closing[0]["text"] == "It is sunny "


@pytest.mark.parametrize("cut", range(1, len(logged_stream()[0])))
def test_any_cut_gives_what_was_logged_and_closes_cleanly(cut):
    events, final = logged_stream()
    log = copy.deepcopy(events[:cut])
    before = copy.deepcopy(log)
    output, closing = recover(log)
    assert log == before                                       # pure
    for index, item in enumerate(output):
        if any(e["type"] == "response.output_item.done" and e["output_index"] == index
               for e in log):
            assert item == final[index]
            continue
        text = "".join(e["delta"] for e in log
                       if e["type"] in DELTAS and e["output_index"] == index)
        assert item["status"] == "incomplete"
        got = item.get("arguments", item.get("input")) if "call" in item["type"] else \
            item["content"][0]["text"]
        assert got == text
    # the log closed with them, then response.failed, is a well-formed stream again
    failed = response_skeleton(id="resp_1", created_at=0.0, model="m", status="failed",
                               output=output)
    tail = Sequencer(len(log)).stamp([*closing, {"type": "response.failed",
                                                 "response": failed}])
    assert check_stream(log + tail)["output"] == output
