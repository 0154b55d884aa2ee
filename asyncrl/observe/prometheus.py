"""A Prometheus exporter: one registry and one HTTP server on loopback per exporting process.

    owner loop ──publish(samples)──▶ snapshot (one reference, replaced whole) ◀──collect── HTTP thread ◀── scraper

The owner (the learner's rank 0 after each step, the hub's loop about once a second) publishes a
complete list of `Sample`s; the server thread only reads the last published list, so a scrape never
touches the owner's live state and never blocks it. Values are as old as the last publish.
The registry is this object's own (no process-wide default registry), so two exporters in one process
do not collide; the port comes from the caller (the launcher picks it and lists it in run.json).
"""

from __future__ import annotations

import math
import re
from urllib.parse import urlsplit
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

LOOPBACK = "127.0.0.1"
_UNSAFE = re.compile(r"[^a-zA-Z0-9_]")


@dataclass(frozen=True, slots=True)
class Sample:
    name: str
    """Metric name without the exporter's namespace, e.g. "loss" (sanitised to [a-zA-Z0-9_])."""
    value: float
    kind: Literal["gauge", "counter"] = "gauge"
    """A counter only grows (the exposition adds the `_total` suffix); anything else is a gauge."""
    labels: tuple[tuple[str, str], ...] = ()
    doc: str = ""


class PrometheusExporter:
    def __init__(self, namespace: str, port: int, host: str = LOOPBACK) -> None:
        self.namespace = namespace
        self._samples: tuple[Sample, ...] = ()
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)
        self._server, self._thread = start_http_server(port, addr=host, registry=self.registry)
        self.port = self._server.server_port

    @property
    def url(self) -> str:
        return metrics_url(self.port)

    def publish(self, samples: Iterable[Sample]) -> None:
        """Replace everything the next scrape returns (non-finite values are left out)."""
        self._samples = tuple(s for s in samples if math.isfinite(s.value))

    def collect(self) -> Iterator[Metric]:  # called by prometheus_client on the server thread
        families: dict[tuple[str, str], Any] = {}
        for s in self._samples:
            name = f"{self.namespace}_{_UNSAFE.sub('_', s.name)}"
            family = families.get((name, s.kind))
            if family is None:
                cls = CounterMetricFamily if s.kind == "counter" else GaugeMetricFamily
                family = families[(name, s.kind)] = cls(name, s.doc or s.name, labels=[k for k, _ in s.labels])
            family.add_metric([v for _, v in s.labels], s.value)
        yield from families.values()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def metrics_url(port: int) -> str:
    """What run.json lists under "metrics_endpoints" for an exporter on `port`."""
    return f"http://{LOOPBACK}:{port}/metrics"


def url_port(url: str) -> int | None:
    """The port of a run.json metrics endpoint ("" or missing: None, no exporter)."""
    return urlsplit(url).port if url else None


def scalar_samples(record: dict[str, Any], skip: Iterable[str] = ()) -> list[Sample]:
    """Every finite number in a (nested) metrics record as a gauge; nested keys joined with "_"."""
    skip = set(skip)
    out: list[Sample] = []
    for key, value in record.items():
        if key in skip:
            continue
        if isinstance(value, dict):
            out.extend(Sample(f"{key}_{s.name}", s.value) for s in scalar_samples(value))
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            out.append(Sample(str(key), float(value)))
    return out
