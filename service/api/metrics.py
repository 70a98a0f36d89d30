"""Prometheus metrics of one app, in its own registry (several apps in one process, as in the
tests, do not collide)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

from service.tiling.service import TilingOutcome

# Cache hits take milliseconds, searches seconds to a minute: buckets cover both.
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class ApiMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.request_latency = Histogram(
            "tilesearch_http_request_duration_seconds", "HTTP request latency by route template",
            ["method", "route"], buckets=LATENCY_BUCKETS, registry=self.registry,
        )
        self.requests = Counter(
            "tilesearch_http_requests", "HTTP requests by route template and status",
            ["method", "route", "status"], registry=self.registry,
        )
        self.tilings = Counter(
            "tilesearch_tilings", "Tiling decisions served, by cache outcome (hit, warm, miss, refined)",
            ["cache"], registry=self.registry,
        )
        self.searches = Counter("tilesearch_searches", "Searches run (cache warm, miss or refined)", registry=self.registry)
        self.incomplete_searches = Counter(
            "tilesearch_searches_incomplete", "Searches cut by their time limit (best plan so far served)",
            registry=self.registry,
        )
        self.evaluations = Counter("tilesearch_evaluations", "Plans evaluated by searches", registry=self.registry)
        self.tiling_errors = Counter(
            "tilesearch_tiling_errors", "Tiling requests rejected, by error type", ["error"], registry=self.registry,
        )
        for cache in ("hit", "warm", "miss", "refined"):
            self.tilings.labels(cache)

    def observe_request(self, method: str, route: str, status: int, seconds: float) -> None:
        self.request_latency.labels(method, route).observe(seconds)
        self.requests.labels(method, route, str(status)).inc()

    def observe_tiling(self, outcome: TilingOutcome) -> None:
        self.tilings.labels(outcome.cache).inc()
        if outcome.cache == "hit":
            return
        stats = outcome.decision.search_stats or {}
        self.searches.inc()
        self.evaluations.inc(int(stats.get("evaluations") or 0))
        if stats.get("complete") is False:
            self.incomplete_searches.inc()
