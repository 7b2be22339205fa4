"""`GET /dashboard`, a page of the adapter: a live view of the whole pipeline, and the JSON it polls.

The page is static HTML + JS + CSS shipped in this package (skippy/adapter/static; no CDN, no build
step). It polls `GET /dashboard/data` (every second, `?interval=MS` to change) and computes rates
between two polls: each stage's utilisation (compute seconds per second), tokens per second,
TTFT and TPOT of the requests that finished in between, the speculative accept rate; plus
micro-batches in flight and queue depths as read. `/dashboard/data` scrapes every process listed
in the run's metrics-targets.json (skippy.telemetry.targets), with the API key as a Bearer token
when there is one (every process of a run guards its /metrics with the same key), and adds the
adapter's own numbers; reading and summarising the samples is skippy.telemetry.scrape's (shared
with the benchmarks). With SSH hosts the data also carries `hosts` (`Dashboard.hosts`, the run's record of them:
each host's state, stages and why it was dropped, and the re-plans), which the page shows as a table. Its routes
(`routes`) are added by the adapter's router, behind the same key, CORS and counting as every other route
(skippy.adapter.routes, skippy.http.auth).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from skippy.http.routing import Handler, Request, Response
from skippy.telemetry.scrape import Sample, parse, scrape, summarise
from skippy.telemetry.targets import read_targets

__all__ = ["Dashboard"]

SCRAPE_TIMEOUT_S = 1.0
_STATIC = {"/dashboard": ("dashboard.html", "text/html; charset=utf-8"),
           "/dashboard/dashboard.js": ("dashboard.js", "text/javascript; charset=utf-8"),
           "/dashboard/dashboard.css": ("dashboard.css", "text/css; charset=utf-8")}


def _static(name: str) -> bytes:
    return resources.files("skippy.adapter").joinpath("static", name).read_bytes()


class Dashboard:
    def __init__(self, own_metrics: Callable[[], Awaitable[bytes]], targets: Path | None = None,
                 own_url: str | None = None, api_key: str | None = None) -> None:
        """`own_metrics`: this process's /metrics text; `targets`: the run's metrics-targets.json (None:
        only this process); `own_url`: this process's /metrics URL (listed there, not scraped again);
        `api_key`: sent to every target."""
        self.own_metrics = own_metrics
        self.targets = targets
        self.own_url = own_url
        self.api_key = api_key
        self.files = {path: (_static(name), kind) for path, (name, kind) in _STATIC.items()}
        self.hosts: Callable[[], dict[str, Any]] = dict  # the run's hosts record ({}: no SSH hosts)

    def routes(self) -> Sequence[tuple[str, str, Handler]]:
        """(method, path, handler) of the page, its files and its data."""
        return [*(("GET", path, self.static) for path in self.files), ("GET", "/dashboard/data", self.data)]

    async def static(self, request: Request) -> Response:
        body, kind = self.files[request.path]
        return Response(200, body, [("cache-control", "no-cache")], content_type=kind)

    async def collect(self) -> list[tuple[str, str, list[Sample] | None]]:
        """Every process's samples: this one's, then each listed target's (None: it did not answer)."""
        own = ("adapter", self.own_url or "", parse((await self.own_metrics()).decode()))
        others = [(name, url) for name, url in read_targets(self.targets) if url != self.own_url] if self.targets else []
        got = await asyncio.gather(*(asyncio.to_thread(scrape, url, SCRAPE_TIMEOUT_S, self.api_key) for _name, url in others))
        return [own, *((name, url, samples) for (name, url), samples in zip(others, got))]

    async def data(self, _request: Request) -> Response:
        body = json.dumps({**summarise(await self.collect()), "hosts": self.hosts()}).encode()
        return Response(200, body, [("cache-control", "no-store")])
