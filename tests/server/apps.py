"""Reaching into a test app (a server of one model)."""

from podium.server.served import Served


def served(app) -> Served:
    """The app's one model, loaded: its engine, dialect and services."""
    [entry] = app.state.models.entries()
    assert entry.state == "loaded"
    return entry.engine
