"""A tiny real HTTP server on 127.0.0.1 that answers GETs from a script: the trigger tests' stand-in for Google.

Each path has a list of (status, body) answers served in order; the last one repeats. Every request is recorded, so a
test can count polls and read headers. It runs on the test's own event loop, next to the trigger under test.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

Answer = tuple[int, Any]  # (HTTP status, JSON body or raw text)


@dataclass
class ScriptedApi:
    """What the server answers and what it was asked."""

    scripts: dict[str, list[Answer]]
    url: str = ""
    requests: list[web.Request] = field(default_factory=list)
    extra_routes: dict[str, Any] = field(default_factory=dict)

    def count(self, path: str) -> int:
        """How many GETs ``path`` received."""
        return sum(1 for r in self.requests if r.path == path)

    async def handle(self, request: web.Request) -> web.Response:
        self.requests.append(request)
        if request.path in self.extra_routes:
            return await self.extra_routes[request.path](request)
        answers = self.scripts.get(request.path)
        if not answers:
            return web.json_response({"error": {"code": 404, "message": f"no script for {request.path}"}}, status=404)
        status, body = answers.pop(0) if len(answers) > 1 else answers[0]
        if isinstance(body, str):
            return web.Response(status=status, text=body, content_type="text/plain")
        return web.Response(status=status, text=json.dumps(body), content_type="application/json")


@asynccontextmanager
async def scripted_api(
    scripts: dict[str, list[Answer]], routes: dict[str, Any] | None = None
) -> AsyncIterator[ScriptedApi]:
    """Serve ``scripts`` (plus handler ``routes`` by path) on a free 127.0.0.1 port for the duration of the block."""
    api = ScriptedApi({k: list(v) for k, v in scripts.items()}, extra_routes=dict(routes or {}))
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", api.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    api.url = f"http://127.0.0.1:{port}"
    try:
        yield api
    finally:
        await runner.cleanup()
