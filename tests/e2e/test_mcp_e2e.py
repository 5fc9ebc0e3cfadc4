"""MCP tools on the real default model: ``podium serve --mcp-allow`` runs a real MCP server's
tools (the ``mcp`` SDK's own, in-process on a free port) in the loop, through the openai SDK."""

import json
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import httpx
import openai
import pytest
from openai.types.responses import Response

from tests.e2e.conftest import MODEL, _free_port, podium_serve
from tests.server.responses_check import check_stream, sse_events
from tests.server.test_mcp import _serve, make_server


@pytest.fixture(scope="module")
def mcp_url():
    server, port = _serve(make_server().streamable_http_app())
    yield f"http://127.0.0.1:{port}/mcp"
    server.should_exit = True


# A server Podium did not write: the MCP project's reference server, in streamable HTTP mode
EVERYTHING_VERSION = "2026.8.31"
EVERYTHING_PORT = _free_port()
EVERYTHING_URL = f"http://127.0.0.1:{EVERYTHING_PORT}/mcp"
DEAD_URL = f"http://127.0.0.1:{_free_port()}/mcp"       # allowed, but nothing listens there


@pytest.fixture(scope="module")
def podium(mcp_url):
    with podium_serve("--ctx-size", "4096", "--log-level", "warning", "--mcp-allow", mcp_url,
                      "--mcp-allow", EVERYTHING_URL, "--mcp-allow", DEAD_URL,
                      "--mcp-timeout", "5") as url:
        yield url


@pytest.fixture(scope="module")
def everything():
    """``@modelcontextprotocol/server-everything`` (pinned, installed once into the cache)."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    root = cache / "podium-tests" / f"mcp-server-everything-{EVERYTHING_VERSION}"
    binary = root / "node_modules" / ".bin" / "mcp-server-everything"
    if not binary.exists():
        npm = shutil.which("npm")
        if npm is None:
            pytest.fail("The server-everything test needs npm (Debian: apt-get install npm)")
        subprocess.run([npm, "install", "--no-audit", "--no-fund", "--prefix", str(root),
                        f"@modelcontextprotocol/server-everything@{EVERYTHING_VERSION}"],
                       check=True, timeout=600, capture_output=True)
    proc = subprocess.Popen([str(binary), "streamableHttp"],
                            env={**os.environ, "PORT": str(EVERYTHING_PORT)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while True:
        assert proc.poll() is None, "server-everything exited"
        try:
            socket.create_connection(("127.0.0.1", EVERYTHING_PORT), timeout=1).close()
            break
        except OSError:
            assert time.monotonic() < deadline, "server-everything did not start"
            time.sleep(0.2)
    yield EVERYTHING_URL
    proc.terminate()
    proc.wait(timeout=10)


@pytest.fixture(scope="module")
def client(podium):
    client = openai.OpenAI(base_url=f"{podium}/v1", api_key="unused", max_retries=0)
    yield client
    client.close()


def calc(url, **extra):
    return {"type": "mcp", "server_label": "calc", "server_url": url,
            "allowed_tools": ["add", "echo", "fail"], **extra}


def forced(name):
    return {"type": "mcp", "server_label": "calc", "name": name}


QUESTION = "What is 1234 + 4321? Use the add tool, then say the result."


def test_the_loop_runs_and_the_output_reaches_the_answer(client, podium, mcp_url):
    # One call, then a round offered no tools (max_tool_calls): a 0.5B model left to itself
    # calls again and again. 5555 is in no prompt but the tool's output. max_output_tokens
    # is the whole response's (both rounds share it): room for the call and the answer.
    body = {"model": MODEL, "input": QUESTION, "temperature": 0, "max_output_tokens": 100,
            "tools": [calc(mcp_url, require_approval="never")], "tool_choice": forced("add"),
            "max_tool_calls": 1}
    plain = client.responses.create(**body)
    kinds = [item.type for item in plain.output]
    assert kinds == ["mcp_list_tools", "mcp_call", "message"], kinds
    made = plain.output[1]
    assert made.name == "add" and made.output == "5555" and made.error is None
    assert json.loads(made.arguments) == {"a": 1234, "b": 4321}
    assert "5555" in plain.output_text.replace(",", "")
    r = httpx.post(f"{podium}/v1/responses", json=dict(body, stream=True), timeout=300)
    final = check_stream(sse_events(r.text))
    assert [i["type"] for i in final["output"]] == kinds
    assert final["output"][-1]["content"][0]["text"] == plain.output_text
    assert final["usage"]["output_tokens"] == plain.usage.output_tokens


def test_approval_then_approve_and_a_failing_call(client, mcp_url):
    tools = [calc(mcp_url)]         # require_approval unset: "always", as OpenAI's API
    first = client.responses.create(model=MODEL, input=QUESTION, tools=tools, temperature=0,
                                    tool_choice=forced("add"), max_output_tokens=40)
    assert [i.type for i in first.output] == ["mcp_list_tools", "mcp_approval_request"]
    request = first.output[1]
    second = client.responses.create(
        model=MODEL, previous_response_id=first.id, tools=tools, temperature=0,
        max_output_tokens=40, max_tool_calls=1,
        input=[{"type": "mcp_approval_response", "approve": True,
                "approval_request_id": request.id}])
    assert second.output[0].type == "mcp_call" and second.output[0].output == "5555"
    assert second.output[0].approval_request_id == request.id
    assert not any(i.type == "mcp_list_tools" for i in second.output)    # reused
    failing = client.responses.create(
        model=MODEL, input="Call the fail tool with why='test'.", temperature=0,
        tools=[calc(mcp_url, require_approval="never")], tool_choice=forced("fail"),
        max_output_tokens=40, max_tool_calls=1)
    Response.model_validate(failing.model_dump())
    failed = next(i for i in failing.output if i.type == "mcp_call")
    assert failed.status == "failed" and failed.error is not None and failed.output is None


def test_a_server_outside_the_allow_list_is_a_400(client):
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(model=MODEL, input="hi", tools=[
            calc("http://127.0.0.1:1/elsewhere", require_approval="never")])
    assert caught.value.body["param"] == "tools[0].server_url"
    assert "--mcp-allow" in caught.value.body["message"]


def test_a_foreign_server_lists_and_runs_echo_and_get_sum(client, everything):
    tools = [{"type": "mcp", "server_label": "everything", "server_url": everything,
              "require_approval": "never", "allowed_tools": ["echo", "get-sum"]}]
    echo = client.responses.create(
        model=MODEL, input="Echo the message 'podium'.", tools=tools, temperature=0,
        tool_choice={"type": "mcp", "server_label": "everything", "name": "echo"},
        max_output_tokens=60, max_tool_calls=1)
    listing = echo.output[0]
    assert listing.type == "mcp_list_tools" and listing.error is None
    assert sorted(t.name for t in listing.tools) == ["echo", "get-sum"]
    made = echo.output[1]
    assert made.type == "mcp_call" and made.name == "echo" and made.error is None
    assert made.output == f"Echo: {json.loads(made.arguments)['message']}"
    total = client.responses.create(
        model=MODEL, input="What is 2 + 40?", tools=tools, temperature=0,
        tool_choice={"type": "mcp", "server_label": "everything", "name": "get-sum"},
        max_output_tokens=60, max_tool_calls=1)
    made = next(i for i in total.output if i.type == "mcp_call")
    assert made.name == "get-sum" and json.loads(made.arguments) == {"a": 2, "b": 40}
    assert made.output == "The sum of 2 and 40 is 42."


def test_denial_and_a_failing_listing(client, mcp_url):
    tools = [calc(mcp_url, require_approval="always"),
             {"type": "mcp", "server_label": "dead", "server_url": DEAD_URL,
              "require_approval": "never"}]
    first = client.responses.create(model=MODEL, input=QUESTION, tools=tools, temperature=0,
                                    tool_choice=forced("add"), max_output_tokens=40)
    dead = next(i for i in first.output if i.server_label == "dead")
    assert dead.type == "mcp_list_tools" and dead.error and dead.tools == []
    request = first.output[-1]
    assert request.type == "mcp_approval_request"
    denied = client.responses.create(
        model=MODEL, previous_response_id=first.id, tools=tools, temperature=0,
        max_output_tokens=40, max_tool_calls=1, input=[{
            "type": "mcp_approval_response", "approve": False, "reason": "not now",
            "approval_request_id": request.id}])
    assert denied.status in ("completed", "incomplete")
    assert not any(i.type == "mcp_call" and i.output is not None for i in denied.output)


def test_cancel_during_a_slow_call(client, podium, mcp_url):
    rid = client.responses.create(
        model=MODEL, input="Sleep for 4 seconds with the slow tool.", background=True,
        tools=[calc(mcp_url, require_approval="never", allowed_tools=["slow"])],
        tool_choice=forced("slow"), max_output_tokens=40).id
    with httpx.stream("GET", f"{podium}/v1/responses/{rid}?stream=true", timeout=120) as r:
        for line in r.iter_lines():
            if line.startswith("data: ") and '"response.mcp_call.in_progress"' in line:
                break
    cancelled = client.responses.cancel(rid)
    assert cancelled.status == "cancelled"
    made = next(i for i in cancelled.output if i.type == "mcp_call")
    assert made.status == "incomplete" and made.output is None
    events = sse_events(httpx.get(f"{podium}/v1/responses/{rid}?stream=true",
                                  timeout=30).text)
    assert check_stream(events)["status"] == "cancelled"


def test_a_hostile_client_is_refused_before_any_session(client, podium, mcp_url):
    """Issue 26's attacks through `podium serve`: a thousand servers in one request, a path
    that resolves outside the allowed prefix, a Host header; each a 400 naming its field,
    and the server still answers /health."""
    origin = mcp_url.rsplit("/", 1)[0]
    cases = [([calc(mcp_url, server_label=f"s{i}") for i in range(1000)], "tools[8]"),
             ([calc(f"{origin}/mcp/../admin")], "tools[0].server_url"),
             ([calc(f"{origin}/mcp/%2e%2e/admin")], "tools[0].server_url"),
             ([calc(mcp_url, headers={"Host": "internal.example"})], "tools[0].headers.Host")]
    for tools, param in cases:
        with pytest.raises(openai.BadRequestError) as caught:
            client.responses.create(model=MODEL, input="hi", tools=tools)
        assert caught.value.body["param"] == param
    assert httpx.get(f"{podium}/health", timeout=5).status_code == 200
