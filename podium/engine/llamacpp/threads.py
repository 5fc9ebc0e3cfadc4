"""How llama.cpp's worker threads wait for each other: OpenMP's wait, set before it starts.

In the build ``./dev`` makes, llama.cpp's CPU backend runs a decode's pieces on OpenMP threads
and waits between them at an OpenMP barrier. libgomp makes a thread that reached the barrier
spin ``GOMP_SPINCOUNT`` times (300,000 by default: about a millisecond) before it sleeps. On
a quiet machine that is what makes a decode fast (a thread's partner arrives within the
spin). When anything else wants the cores (another server, a second engine in this process,
a browser), a thread spins while the partner it waits for is not even running, and the decode
collapses instead of slowing in proportion (docs/performance.md, "Graceful under
contention").

``WAITS`` maps ``--thread-wait`` to what libgomp reads from the environment when it loads
(once: when llama.cpp's library is first imported; later changes do nothing):

- ``spin``: spin until the partner arrives (``OMP_WAIT_POLICY=ACTIVE``);
- ``openmp``: libgomp's own default (spin 300,000 times, then sleep);
- ``brief`` (the default): spin ``BRIEF_SPINS`` times, then sleep (``GOMP_SPINCOUNT``).
  On this 2-core machine (bench/contention.py, 2 threads a server) it decodes as fast as
  ``openmp`` alone (57.5 against 57.8 tokens/s), and two servers at once each keep 34
  tokens/s (``openmp``: 0.7), a stream beside a one-thread CPU hog 34 (``openmp``: 0.6);
  1,000 spins kept 23, 10,000 spins 5, 100 spins lost 15% alone;
- ``sleep``: sleep at once (``OMP_WAIT_POLICY=PASSIVE``).

A variable the user set themselves (``OMP_WAIT_POLICY``, ``GOMP_SPINCOUNT``) is left as it is.
"""

from __future__ import annotations

import logging
import os
import sys

log = logging.getLogger(__name__)

ENV = "PODIUM_THREAD_WAIT"      # the setting's environment variable (--thread-wait)
MARK = "PODIUM_OMP_SET"         # which OpenMP variables Podium set (a child inherits them)
BRIEF_SPINS = "300"
WAITS: dict[str, dict[str, str]] = {
    "spin": {"OMP_WAIT_POLICY": "ACTIVE"},
    "openmp": {},
    "brief": {"GOMP_SPINCOUNT": BRIEF_SPINS},
    "sleep": {"OMP_WAIT_POLICY": "PASSIVE"},
}
DEFAULT = "brief"
_OWN = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")


def configure(wait: str | None = None) -> dict[str, str]:
    """Put ``wait``'s variables (default: ``$PODIUM_THREAD_WAIT``, else ``DEFAULT``) into
    this process's environment, where OpenMP reads them when llama.cpp loads (and servers
    this process starts inherit them); what is in effect. The user's own OpenMP variables
    win. ValueError for an unknown wait."""
    wait = wait or os.environ.get(ENV) or DEFAULT
    if wait not in WAITS:
        raise ValueError(f"thread-wait is {wait!r}: one of {', '.join(WAITS)}")
    previous = os.environ.get(ENV)
    os.environ[ENV] = wait
    if _users_own():
        return {name: os.environ[name] for name in _OWN if name in os.environ}
    for name in _OWN:
        os.environ.pop(name, None)
    os.environ.update(WAITS[wait])
    os.environ[MARK] = ",".join(WAITS[wait])
    if "llama_cpp" in sys.modules and previous not in (None, wait):
        log.warning("thread-wait %s: llama.cpp is loaded already (with %s); it applies to the "
                    "next process", wait, previous)
    return dict(WAITS[wait])


def _users_own() -> bool:
    """An OpenMP wait variable is set, and not as Podium set it."""
    mine = os.environ.get(MARK)
    if mine is None:
        return any(name in os.environ for name in _OWN)
    return any((name in os.environ) != (name in mine.split(",")) for name in _OWN)
