"""Prometheus metrics for /metrics: request counters and latency (also per
tenant, when the server has API keys), plus every stats source (engine,
capture, judge, trainer) exported as a gauge.

A stats key `train/grad_norm` becomes the gauge `clawloop_train_grad_norm`.
Each app has its own registry, so several apps can live in one process.
"""

from __future__ import annotations

import re
from typing import Callable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily

_BAD = re.compile(r"[^a-zA-Z0-9_]")


def metric_name(key: str) -> str:
    return "clawloop_" + _BAD.sub("_", key).strip("_")


class _StatsCollector:
    def __init__(self) -> None:
        self.sources: list[Callable[[], dict[str, float]]] = []

    def collect(self):
        seen: dict[str, float] = {}
        for fn in self.sources:
            for k, v in fn().items():
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    seen[metric_name(k)] = float(v)
        for name, v in sorted(seen.items()):
            g = GaugeMetricFamily(name, name)
            g.add_metric([], v)
            yield g


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("clawloop_requests", "Chat requests by HTTP status", ["code"],
                                registry=self.registry)
        self.latency = Histogram("clawloop_request_seconds", "Chat request latency (full response)",
                                 buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
                                 registry=self.registry)
        self.tokens = Counter("clawloop_completion_tokens", "Completion tokens served", registry=self.registry)
        self.tenant_requests = Counter("clawloop_tenant_requests", "Chat requests by tenant (API key name) and "
                                       "HTTP status", ["tenant", "code"], registry=self.registry)
        self.tenant_tokens = Counter("clawloop_tenant_completion_tokens", "Completion tokens served by tenant",
                                     ["tenant"], registry=self.registry)
        self._stats = _StatsCollector()
        self.registry.register(self._stats)

    def add_stats(self, fn: Callable[[], dict[str, float]]) -> None:
        self._stats.sources.append(fn)

    def observe_request(self, code: int, seconds: float, completion_tokens: int, tenant: str = "") -> None:
        """One finished chat request; `tenant` is "" when the server has no keys (or auth failed)."""
        self.requests.labels(code=str(code)).inc()
        if code == 200:
            self.latency.observe(seconds)
            self.tokens.inc(completion_tokens)
        if tenant:
            self.tenant_requests.labels(tenant=tenant, code=str(code)).inc()
            if completion_tokens:
                self.tenant_tokens.labels(tenant=tenant).inc(completion_tokens)

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
