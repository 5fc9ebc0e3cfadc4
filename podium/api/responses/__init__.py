"""The Responses API adapter, split along its jobs: ``translate`` (the request in the
conversation stage's terms), ``runner`` (one response's events), ``log`` (event logs, their
followers and the last writes), ``service`` (create, background lifecycle, reading back)."""

from podium.api.responses.service import ResponsesService

__all__ = ["ResponsesService"]
