"""The live page on the gateway: ``GET /experiments`` (HTML, ``live_page``) and ``GET
/experiments.json`` (the same numbers), from the service's metrics endpoints, sampled
every ``every`` seconds into a ``live_data.History`` by a task of the gateway's loop. An
endpoint that does not answer is shown down on the page, the others are still summed.

With a guardrails ``Controller`` (``flows.guardrails.control``), each sample is also
tested against the experiments' guardrails (acting on a breach), the page shows each
guardrail's state, and ``GET /metrics`` serves the gateway's own metrics
(``tsi_guardrail_breaches_total``).
"""

from __future__ import annotations

import asyncio
import logging
import time
import urllib.request
from collections.abc import Sequence

import orjson
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Route

from flows.gateway.live_data import History, Sample, summary
from flows.gateway.live_page import render
from flows.guardrails.control import METRICS, Controller

__all__ = ["Live"]

log = logging.getLogger(__name__)

#: the most seconds one endpoint's answer is waited for
FETCH_TIMEOUT = 5.0


def fetch(url: str, timeout: float) -> str | Exception:
    """The text ``url`` answers, or the error that came instead."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as answer:
            return answer.read().decode()
    except (OSError, ValueError) as exc:  # URLError, HTTPError, refused, timed out, bad url
        return exc


class Live:
    """The sampler and the two routes over the metrics ``urls`` (a cluster's processes)."""

    def __init__(
        self, urls: Sequence[str], every: float, controller: Controller | None = None
    ) -> None:
        if not urls:
            raise ValueError("the live page needs at least one metrics url")
        self.urls = tuple(urls)
        self.every = every
        self.history = History(every)
        self.controller = controller

    async def sample(self) -> None:
        """Fetch every endpoint at once, add what they answered to the history."""
        loop = asyncio.get_running_loop()
        timeout = min(self.every, FETCH_TIMEOUT)
        texts = await asyncio.gather(
            *(loop.run_in_executor(None, fetch, url, timeout) for url in self.urls)
        )
        self.history.add(Sample.of(time.time(), zip(self.urls, texts, strict=True)))
        if self.controller is not None:
            self.controller.observe(self.history.latest.samples)

    def summary(self) -> dict:
        """The page's numbers, each experiment with its guardrails' states if any."""
        data = summary(self.history)
        checks = {} if self.controller is None else self.controller.checks
        for experiment in data["experiments"]:
            found = checks.get(experiment["experiment"], [])
            experiment["guardrails"] = [c.to_dict() for c in found]
        return data

    async def run(self) -> None:
        """Sample every ``every`` seconds until cancelled."""
        while True:
            try:
                await self.sample()
            except Exception:  # a bug must not end the page: log it, sample again
                log.exception("sampling the metrics for the live page failed")
            await asyncio.sleep(self.every)

    async def page(self, _request: Request) -> Response:
        return HTMLResponse(render(self.summary()))

    async def data(self, _request: Request) -> Response:
        return Response(orjson.dumps(self.summary()), media_type="application/json")

    async def metrics(self, _request: Request) -> Response:
        return Response(generate_latest(METRICS), media_type=CONTENT_TYPE_LATEST)

    def routes(self) -> list[Route]:
        return [
            Route("/experiments", self.page, methods=["GET"]),
            Route("/experiments.json", self.data, methods=["GET"]),
            Route("/metrics", self.metrics, methods=["GET"]),
        ]
