"""The HTTP server: one aiohttp app on 127.0.0.1 that routes every request by path to an API or the admin API.

Every call outside ``/sandbox/`` and the token endpoint is authenticated first (:mod:`sandbox.auth`): without a valid
bearer token it gets Google's 401 (the Kubernetes API: its ``Unauthorized`` Status) and goes no further.
For an API call: settle the operations that are due, match the route, count it against its project's rate quota
(:mod:`sandbox.quotas`: past it, Google's quota error), apply a status fault (the call then never
reaches the API) or note an operation fault, run the handler, save the state if it changed, log the call. Handlers
run on one event loop, so a request sees and leaves the store consistent; only ``operations.wait`` awaits.
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import sys
import time
from pathlib import Path
from typing import Any

from aiohttp import web

from sandbox import admin, apis, auth
from sandbox.context import Sandbox
from sandbox.errors import ApiError
from sandbox.http import Call, Reply, error_reply

HOST = "127.0.0.1"
# Lustre exports and cluster bodies are small; this only guards against a runaway client.
MAX_BODY_BYTES = 16 * 1024 * 1024
log = logging.getLogger("sandbox")


class SandboxServer:
    """Routes requests to the APIs and the admin API of one :class:`Sandbox`."""

    def __init__(self, sandbox: Sandbox) -> None:
        self.sandbox = sandbox
        self.api_routes = apis.router()
        self.admin_routes = admin.router()

    def app(self) -> web.Application:
        """The aiohttp application: a single catch-all route, so the sandbox owns 404s and error shapes."""
        application = web.Application(client_max_size=MAX_BODY_BYTES)
        application.router.add_route("*", "/{tail:.*}", self.handle)
        return application

    async def handle(self, request: web.Request) -> web.Response:
        """Answer one HTTP request with JSON."""
        if request.path.startswith("/sandbox/"):
            call = Call(request.method, request.path, request.query_string, await request.text())
            result = await self._admin(call)
            return web.json_response(result.body, status=result.status, dumps=_dumps)
        if request.path == auth.TOKEN_PATH:
            return await self._token(request)
        # Google and the API server authenticate before anything else: no route, fault or handler sees the call.
        verdict = self.sandbox.auth.verify(request.headers.get("Authorization"))
        call = Call(request.method, request.path, request.query_string, await request.text())
        if verdict is not auth.Verdict.VALID:
            return self._unauthenticated(call, verdict)
        result = await self._api(call)
        return web.json_response(result.body, status=result.status, dumps=_dumps)

    async def _token(self, request: web.Request) -> web.Response:
        """Google's OAuth token endpoint for the sandbox's key (the key file's ``token_uri``)."""
        if request.method != "POST":
            return web.json_response(
                {"error": "invalid_request", "error_description": "Only POST is served"}, status=405
            )
        try:
            body = self.sandbox.auth.grant(await request.text(), self.sandbox.url)
        except auth.GrantError as exc:
            return web.json_response(exc.body(), status=400)
        return web.json_response(body, headers={"Cache-Control": "no-store"})

    def _unauthenticated(self, call: Call, verdict: auth.Verdict) -> web.Response:
        # Logged like any call (with its verdict), so a test sees what was refused.
        sb = self.sandbox
        try:
            service = self.api_routes.match(call.method, call.path)[0].service
        except ApiError:
            service = ""
        body = auth.unauthenticated_body(verdict, f"{service}.googleapis.com" if service else "")
        sb.calls.append(
            time=sb.now(),
            method=call.method,
            path=call.path,
            query=call.query_string,
            service=service,
            status=401,
            duration_ms=0.0,
            operations=[],
            fault=None,
            error=body["error"]["message"],
            auth=str(verdict),
        )
        return web.json_response(body, status=401, dumps=_dumps, headers={"WWW-Authenticate": auth.WWW_AUTHENTICATE})

    async def _admin(self, call: Call) -> Reply:
        self.sandbox.store.settle(self.sandbox.now())
        try:
            route, call.params = self.admin_routes.match(call.method, call.path)
            result = await route.handler(self.sandbox, call)
        except ApiError as exc:
            result = error_reply(exc)
        self.sandbox.store.save_if_dirty()
        return result

    async def _api(self, call: Call) -> Reply:
        sb = self.sandbox
        started = time.perf_counter()
        sb.store.settle(sb.now())
        fault_id = None
        held = None
        try:
            route, call.params = self.api_routes.match(call.method, call.path)
            call.service = route.service
            if "project" in call.params:
                # Counted like Google counts: every authenticated call, refused or not by what follows.
                limits = sb.store.config.rate_quotas
                sb.rates.charge(call.params["project"], route.service, call.method, limits, sb.now())
            fault = sb.faults.call_fault(call.method, call.path, call.query_string, call.text)
            if fault is not None:
                fault_id = fault.id
                result = error_reply(fault.call_error())
            else:
                call.operation_fault = sb.faults.operation_fault(call.method, call.path, call.query_string, call.text)
                result = await route.handler(sb, call)
                if call.started:
                    sb.faults.operation_started(
                        call.method, call.path, call.query_string, call.operation_fault, call.text
                    )
                    if call.operation_fault is not None:
                        fault_id = call.operation_fault.id
                held = sb.faults.delay_fault(call.method, call.path, call.query_string, call.text)
                fault_id = fault_id or (held.id if held else None)
        except ApiError as exc:
            result = error_reply(exc)
        except Exception as exc:
            log.exception("%s %s failed", call.method, call.path)
            result = error_reply(ApiError("INTERNAL", f"Sandbox internal error: {type(exc).__name__}: {exc}"))
        sb.store.save_if_dirty()
        error = result.body.get("error", {}).get("message") if isinstance(result.body, dict) else None
        sb.calls.append(
            time=sb.now(),
            method=call.method,
            path=call.path,
            query=call.query_string,
            service=call.service,
            status=result.status,
            duration_ms=round(1000 * (time.perf_counter() - started), 3),
            operations=list(call.started),
            fault=fault_id,
            error=error,
            auth=str(auth.Verdict.VALID),
            body=_json_body(call.text),
        )
        if held is not None and held.delay_s:
            # The call has taken effect (and is in the call log); only its answer waits.
            await asyncio.sleep(held.delay_s)
        return result


def _json_body(text: str) -> Any:
    """The request's JSON body for the call log, or None (no body, or not JSON: a media upload)."""
    try:
        return json.loads(text) if text.strip() else None
    except ValueError:
        return None


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def open_sandbox(
    state_dir: Path, latency_scale: float, seed: Path | None, token_lifetime_s: float = auth.DEFAULT_LIFETIME_S
) -> Sandbox:
    """Load the state dir (or start empty), apply the seed file, settle what finished while it was down, save."""
    sandbox = Sandbox(state_dir, latency_scale, token_lifetime_s)
    state_dir.mkdir(parents=True, exist_ok=True)
    sandbox.store.load()
    if seed is not None:
        sandbox.store.config.apply_seed(json.loads(seed.read_text(encoding="utf-8")), sandbox.now())
    sandbox.store.settle(sandbox.now())
    # Each cluster that runs serves its Kubernetes API again, with the CA its clients already trust.
    sandbox.kube.serve_running()
    sandbox.store.save()
    return sandbox


async def serve(
    port: int,
    state_dir: Path,
    latency_scale: float,
    seed: Path | None,
    token_lifetime_s: float = auth.DEFAULT_LIFETIME_S,
) -> None:
    """Serve on ``127.0.0.1:port`` (0 picks a free port) until SIGTERM or SIGINT."""
    sandbox = open_sandbox(state_dir, latency_scale, seed, token_lifetime_s)
    runner = web.AppRunner(SandboxServer(sandbox).app(), access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, host=HOST, port=port)
    await site.start()
    bound = runner.addresses[0][1]
    sandbox.url = f"http://{HOST}:{bound}"
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    print(
        f"sandbox ready on {sandbox.url} (state {state_dir}, latency scale {latency_scale})",
        file=sys.stdout,
        flush=True,
    )
    try:
        await stop.wait()
    finally:
        await sandbox.kuberay.shutdown()
        await sandbox.kube.close()
        await runner.cleanup()
        sandbox.store.save()
