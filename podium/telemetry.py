"""What Podium tells its operators: Prometheus metrics and one log line per request.

``RequestRecord`` follows one HTTP request (a context variable makes it reachable from the
generation code without threading it through every call); when the request ends the access
middleware turns it into metrics and a log line. Prompts and outputs are never logged unless
``--log-requests`` is set.
"""

from __future__ import annotations

import json
import logging
import math
from array import array
import time
from bisect import bisect_left
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

access_log = logging.getLogger("podium.access")

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
GAP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)


class Metrics:
    """The app's metrics, in a registry of its own (several apps can live in one process)."""

    def __init__(self, gauges: Callable[[], dict[str, Any]]):
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("podium_requests", "HTTP requests by endpoint and status",
                                ["endpoint", "status"], registry=r)
        self.ttft = Histogram("podium_time_to_first_token_seconds",
                              "Time from request to first generated token",
                              buckets=LATENCY_BUCKETS, registry=r)
        # observed once per engine output: kept as plain numbers (no lock, no label
        # lookup) and exposed at scrape time exactly as prometheus-client's own would be
        self.itl = LoopHistogram("podium_inter_token_latency_seconds",
                                 "Time between generated tokens of one choice", GAP_BUCKETS)
        r.register(self.itl)
        self.prompt_tokens = Counter("podium_prompt_tokens", "Prompt tokens processed",
                                     registry=r)
        self.generation_tokens = LoopCounter("podium_generation_tokens", "Tokens generated")
        r.register(self.generation_tokens)
        self.errors = Counter("podium_errors", "Error responses by error type", ["type"],
                              registry=r)
        self.batch_requests = Counter("podium_batch_requests",
                                      "Batch requests answered here, by result (completed: "
                                      "in the output file; failed: in the error file)",
                                      ["result"], registry=r)
        r.register(_GaugeCollector(gauges))


class LoopHistogram:
    """A histogram updated only on the event loop's thread: ``observe`` is a bisect and two
    additions. Collected as prometheus-client's ``Histogram`` exposes itself (cumulative
    buckets, ``_count``, ``_sum``, ``_created``). The numbers live in C arrays (no int
    object made at the end of a burst pins an arena; docs/architecture.md)."""

    __slots__ = ("name", "doc", "bounds", "counts", "sum", "created")

    def __init__(self, name: str, doc: str, buckets: tuple[float, ...]):
        self.name, self.doc = name, doc
        self.bounds = tuple(float(b) for b in buckets) + (math.inf,)
        self.counts = array("q", bytes(8 * len(self.bounds)))
        self.sum = array("d", [0.0])
        self.created = time.time()

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum[0] += value

    def collect(self):
        metric = Metric(self.name, self.doc, "histogram")
        total = 0
        for bound, count in zip(self.bounds, self.counts):
            total += count
            metric.add_sample(self.name + "_bucket", {"le": _bound(bound)}, total)
        metric.add_sample(self.name + "_count", {}, total)
        metric.add_sample(self.name + "_sum", {}, self.sum[0])
        created = Metric(self.name + "_created", self.doc, "gauge")
        created.add_sample(self.name + "_created", {}, self.created)
        return [metric, created]


def _bound(bound: float) -> str:
    """A bucket's ``le`` label as prometheus-client writes it (``0.001``, ``1.0``, ``+Inf``)."""
    return "+Inf" if bound == math.inf else repr(bound)


class LoopCounter:
    """A counter updated only on the event loop's thread, exposed as prometheus-client's
    ``Counter`` is (``_total`` and ``_created``)."""

    __slots__ = ("name", "doc", "value", "created")

    def __init__(self, name: str, doc: str):
        self.name, self.doc = name, doc
        self.value = array("q", [0])
        self.created = time.time()

    def inc(self, amount: int = 1) -> None:
        self.value[0] += amount

    def collect(self):
        total = Metric(self.name, self.doc, "counter")
        total.add_sample(self.name + "_total", {}, self.value[0])
        created = Metric(self.name + "_created", self.doc, "gauge")
        created.add_sample(self.name + "_created", {}, self.created)
        return [total, created]


class Labelled(NamedTuple):
    """A gauge's values by one label other than ``model`` (batches by ``status``)."""
    label: str
    values: dict[str, float]


class ModelLabelled(NamedTuple):
    """A figure's values by model and one more label (draft tokens by ``source``)."""
    label: str
    values: dict[str, dict[str, float]]     # model -> label's value -> figure


class _GaugeCollector:
    """Figures read at scrape time (each model's engine and loads, the store's size):
    nothing to keep in sync. A value by model is labelled ``model`` (a ``Labelled`` one by
    its own label, a ``ModelLabelled`` one by both); a name ending in ``_total`` is a
    counter."""

    def __init__(self, read: Callable[[], dict[str, Any]]):
        self._read = read

    def collect(self):
        for name, value in self._read().items():
            doc = name.removesuffix("_total").replace("_", " ")
            counter = name.endswith("_total")
            if isinstance(value, Labelled):
                family = GaugeMetricFamily(f"podium_{name}", doc, labels=[value.label])
                for key, figure in value.values.items():
                    family.add_metric([key], figure)
                yield family
                continue
            if isinstance(value, ModelLabelled):
                labels = ["model", value.label]
                rows = [([model, key], figure) for model, figures in value.values.items()
                        for key, figure in figures.items()]
            elif isinstance(value, dict):
                labels = ["model"]
                rows = [([model], figure) for model, figure in value.items()]
            else:
                yield GaugeMetricFamily(f"podium_{name}", doc, value=value)
                continue
            family = (CounterMetricFamily(f"podium_{name.removesuffix('_total')}", doc,
                                          labels=labels) if counter
                      else GaugeMetricFamily(f"podium_{name}", doc, labels=labels))
            for keys, figure in rows:
                family.add_metric(keys, figure)
            yield family


@dataclass
class RequestRecord:
    id: str
    endpoint: str
    metrics: Metrics | None = None
    capture: bool = False                # --log-requests: keep the request and output text
    start: float = field(default_factory=time.monotonic)
    model: str | None = None
    status: int = 0
    error_type: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    reasoning_budget: int | None = None     # the request's, in tokens (None: none)
    reasoning_tokens: int = 0
    prediction_tokens: int | None = None    # the prediction's, offered as drafts (None: none)
    accepted_prediction_tokens: int = 0
    rejected_prediction_tokens: int = 0
    first_token: float | None = None
    _last_token: float | None = None
    body: bytes = b""
    output: list[str] = field(default_factory=list)

    def meter(self) -> Callable[[int], None]:
        """The per-output callback for this request's new tokens (``meter()(count)``): the
        count, the first token's time (TTFT), the interval since the last token (ITL) and
        the generated-tokens counter. It runs for every engine output, so everything it
        touches is bound once here."""
        metrics, monotonic = self.metrics, time.monotonic
        if metrics is None:
            def count_only(count: int) -> None:
                self.completion_tokens += count
                if self.first_token is None:
                    self.first_token = monotonic()
            return count_only
        generated, ttft = metrics.generation_tokens.value, metrics.ttft
        itl_counts, itl_sum, itl_bounds = metrics.itl.counts, metrics.itl.sum, metrics.itl.bounds

        def tokens(count: int) -> None:
            now = monotonic()
            last, self._last_token = self._last_token, now
            self.completion_tokens += count
            generated[0] += count
            if last is not None:                # LoopHistogram.observe, inline
                itl_counts[bisect_left(itl_bounds, now - last)] += 1
                itl_sum[0] += now - last
            elif self.first_token is None:
                self.first_token = now
                ttft.observe(now - self.start)
        return tokens

    def prompt(self, count: int) -> None:
        self.prompt_tokens += count
        if self.metrics is not None:
            self.metrics.prompt_tokens.inc(count)

    def line(self, json_format: bool) -> str:
        fields: dict[str, Any] = {
            "request_id": self.id, "endpoint": self.endpoint, "model": self.model,
            "status": self.status, "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "ttft_ms": None if self.first_token is None
            else round((self.first_token - self.start) * 1000, 1),
            "duration_ms": round((time.monotonic() - self.start) * 1000, 1)}
        if self.reasoning_budget is not None:     # applied, and whether reasoning reached it
            fields["reasoning_budget"] = self.reasoning_budget
            fields["reasoning_tokens"] = self.reasoning_tokens
        if self.prediction_tokens is not None:      # offered, and how much of it was used
            fields["prediction_tokens"] = self.prediction_tokens
            fields["accepted_prediction_tokens"] = self.accepted_prediction_tokens
            fields["rejected_prediction_tokens"] = self.rejected_prediction_tokens
        if self.error_type:
            fields["error"] = self.error_type
        if self.capture:
            fields["request"] = self.body.decode("utf-8", "replace")
            fields["output"] = "".join(self.output)
        if json_format:
            return json.dumps(fields, ensure_ascii=False)
        return " ".join(f"{k}={json.dumps(v, ensure_ascii=False) if isinstance(v, str) else v}"
                        for k, v in fields.items())


CURRENT: ContextVar[RequestRecord | None] = ContextVar("podium_request", default=None)


def current() -> RequestRecord | None:
    return CURRENT.get()


def note_error(kind: str) -> None:
    """Count an error response (by code or type) for the current request."""
    record = CURRENT.get()
    if record is not None:
        record.error_type = kind
        if record.metrics is not None:
            record.metrics.errors.labels(kind).inc()
