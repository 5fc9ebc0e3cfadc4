"""Waiting on a condition in tests that drive a server in another thread or process."""

import time


def wait_for(condition, seconds: float = 5.0) -> bool:
    """Poll ``condition`` every 20 ms; whether it held within ``seconds``."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True
