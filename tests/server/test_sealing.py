"""Sealed reasoning (Responses' ``encrypted_content``, Messages' thinking ``signature``):
unreadable by the client, bound to the API key it was issued to, refused when forged, old or
over-long. Through the official openai and anthropic SDKs against Podium over HTTP."""

from __future__ import annotations

import base64
import hashlib
import hmac

import anthropic
import openai
import pytest

from podium.api.sealing import Sealer
from tests.conftest import SERVED
from tests.server.test_conversations import serve  # noqa: F401 - the fixture
from tests.server.test_responses import THINK

SECRET = "Secret plan: fetch the weather"
REPLY = f"<think>{SECRET}</think>Done."


def decoded(token: str) -> bytes:
    """Every base64 reading of a token's dot-separated parts, joined: what a client can see
    without the server's key."""
    out = b""
    for part in token.split("."):
        try:
            out += base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))
        except ValueError:
            pass
    return out


def replay(reasoning) -> list[dict]:
    """A stateless client's next input: the turn with its sealed reasoning, then more."""
    return [{"role": "user", "content": "Weather?"},
            {**reasoning.model_dump(exclude_none=True), "content": None, "summary": []},
            {"role": "assistant", "content": "Done."},
            {"role": "user", "content": "And tomorrow?"}]


def first_reasoning(client: openai.OpenAI):
    r = client.responses.create(model=SERVED, input="Weather?", store=False,
                                include=["reasoning.encrypted_content"])
    reasoning = r.output[0]
    assert reasoning.type == "reasoning" and reasoning.encrypted_content
    return reasoning


def refused(call) -> dict:
    with pytest.raises(openai.BadRequestError) as err:
        call()
    return err.value.response.json()["error"]


# -- the primitive ------------------------------------------------------------------------

def test_a_seal_opens_for_its_owner_alone_and_hides_its_text():
    sealer = Sealer(b"server secret")
    token = sealer.seal(SECRET, "key_a")
    assert token.startswith("podium.v2.") and SECRET.encode() not in decoded(token)
    assert sealer.unseal(token, "key_a") == SECRET
    assert token != sealer.seal(SECRET, "key_a")            # a fresh nonce each time
    forged = token[:-6] + ("AAAAAA" if not token.endswith("AAAAAA") else "BBBBBB")
    messages = set()
    for bad, owner in ((token, "key_b"), (token, ""), (forged, "key_a"),
                       ("podium.v2.", "key_a"), ("podium.v2.!!!!", "key_a"),
                       (Sealer(b"another secret").seal(SECRET, "key_a"), "key_a")):
        with pytest.raises(Exception) as err:
            sealer.unseal(bad, owner, param="input[1].encrypted_content")
        assert getattr(err.value, "param", None) == "input[1].encrypted_content"
        messages.add(str(err.value))
    assert len(messages) == 1       # forged, altered, another key's: one answer


# -- Responses ----------------------------------------------------------------------------

def test_encrypted_content_is_unreadable_and_bound_to_its_key(serve):
    served = serve([REPLY] * 2 + ["Sunny."] * 3, template=THINK, api_key=["key-a", "key-b"])
    a, b = served.client("key-a"), served.client("key-b")
    reasoning = first_reasoning(a)
    assert SECRET.encode() not in decoded(reasoning.encrypted_content)
    # its own key: the reasoning goes back into the prompt
    assert a.responses.create(model=SERVED, input=replay(reasoning), store=False).status == (
        "completed")
    assert f"<think>{SECRET}</think>" in served.prompt()
    # another key: the same 400 as a forged seal, naming the item's field
    stolen = refused(lambda: b.responses.create(model=SERVED, input=replay(reasoning),
                                                store=False))
    token = reasoning.encrypted_content
    forged_item = reasoning.model_copy(update={"encrypted_content": token[:-8] + "AAAAAAAA"})
    forged = refused(lambda: a.responses.create(model=SERVED, input=replay(forged_item),
                                                store=False))
    assert stolen["param"] == forged["param"] == "input[1].encrypted_content"
    assert stolen["message"] == forged["message"]
    assert len(served.engine.requests) == 2        # neither refused request reached the model


def test_old_and_over_long_seals_are_refused_before_decoding(serve):
    served = serve([REPLY] + ["Sunny."] * 2, template=THINK, secret_key="s3cret",
                   max_seal_bytes=400)
    client = served.client()
    reasoning = first_reasoning(client)
    # a podium.v1 token, made as the old server made them (readable, HMAC-signed): refused
    body = base64.urlsafe_b64encode(SECRET.encode()).decode()
    mac = base64.urlsafe_b64encode(hmac.new(b"s3cret", body.encode(), hashlib.sha256)
                                   .digest()).decode().rstrip("=")
    old = reasoning.model_copy(update={"encrypted_content": f"podium.v1.{body}.{mac}"})
    error = refused(lambda: client.responses.create(model=SERVED, input=replay(old),
                                                    store=False))
    assert error["param"] == "input[1].encrypted_content" and "podium.v1" in error["message"]
    long = reasoning.model_copy(update={"encrypted_content": "podium.v2." + "A" * 500})
    error = refused(lambda: client.responses.create(model=SERVED, input=replay(long),
                                                    store=False))
    assert error["param"] == "input[1].encrypted_content"
    assert "--max-seal-bytes" in error["message"] and "510" in error["message"]
    assert len(served.engine.requests) == 1


# -- Messages -----------------------------------------------------------------------------

def anthropic_client(served, key: str) -> anthropic.Anthropic:
    client = anthropic.Anthropic(base_url=f"http://127.0.0.1:{served.port}", api_key=key,
                                 max_retries=0)
    served.clients.append(client)                   # closed with the server
    return client


def again(first) -> list[dict]:
    return [{"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": [b.model_dump(exclude_none=True)
                                              for b in first.content]},
            {"role": "user", "content": "Thanks."}]


def test_omitted_thinking_is_unreadable_and_opens_for_its_key_alone(serve):
    served = serve([REPLY] + ["ok"] * 2, template=THINK, api_key=["key-a", "key-b"])
    a, b = anthropic_client(served, "key-a"), anthropic_client(served, "key-b")
    first = a.messages.create(model=SERVED, max_tokens=100, messages=[
        {"role": "user", "content": "Weather?"}],
        thinking={"type": "adaptive", "display": "omitted"})  # type: ignore[typeddict-item]
    thinking = first.content[0]
    assert thinking.type == "thinking" and thinking.thinking == ""
    assert SECRET.encode() not in decoded(thinking.signature)
    b.messages.create(model=SERVED, max_tokens=100, messages=again(first))
    assert SECRET not in served.prompt()            # another key's seal: left out
    a.messages.create(model=SERVED, max_tokens=100, messages=again(first))
    assert f"<think>{SECRET}</think>" in served.prompt()
    a.close()
    b.close()
