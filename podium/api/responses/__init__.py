"""The Responses API adapter, split along its jobs: ``translate`` (the request in the
conversation stage's terms), ``planner`` (history, MCP tools, the prompt cut to the context,
the next round of the model), ``runner`` (one response's run), ``log`` (event logs, their
followers and the last writes), ``leases`` (which replica runs what), ``service`` (create:
one run -> log -> finalize path; retrieve, cancel, delete, input items)."""

from podium.api.responses.service import ResponsesService

__all__ = ["ResponsesService"]
