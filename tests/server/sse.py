"""Reading SSE bodies in tests."""

import json


def events(body: str) -> list:
    """The JSON objects of an SSE body; asserts it ends with exactly one [DONE]."""
    frames = [f for f in body.split("\n\n") if f.strip()]
    assert all(f.startswith("data: ") for f in frames), frames
    assert frames[-1] == "data: [DONE]"
    assert sum(f == "data: [DONE]" for f in frames) == 1
    return [json.loads(f[len("data: "):]) for f in frames[:-1]]
