"""Requests as handlers see them (:class:`Call`), what they answer (:class:`Reply`), and the path router.

Routes are written as Google's REST templates (``/v1/projects/{project}/locations/{location}/clusters``); a variable
matches one path segment up to a ``/`` or ``:``, so custom verbs (``instances/{instance}:exportData``,
``services:batchGet``) are literal suffixes.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs

from sandbox.errors import ApiError, invalid, not_found

if TYPE_CHECKING:
    from sandbox.faults import Fault


@dataclass
class Call:
    """One API request: method, path, query, body text, route variables, and what the sandbox noted about it."""

    method: str
    path: str
    query_string: str
    text: str
    params: dict[str, str] = field(default_factory=dict)
    service: str = ""
    operation_fault: Fault | None = None
    started: list[str] = field(default_factory=list)

    @property
    def query(self) -> dict[str, list[str]]:
        """Query parameters (repeated ones keep every value)."""
        return parse_qs(self.query_string, keep_blank_values=True)

    def arg(self, name: str, default: str | None = None) -> str | None:
        """The first value of a query parameter."""
        values = self.query.get(name)
        return values[0] if values else default

    def args(self, name: str) -> list[str]:
        """Every value of a repeated query parameter."""
        return self.query.get(name, [])

    def json(self) -> dict[str, Any]:
        """The body as a JSON object; 400 as Google answers a body that is not one."""
        if not self.text.strip():
            raise invalid("Invalid JSON payload received. The request body is empty.", reason="required")
        try:
            body = json.loads(self.text)
        except json.JSONDecodeError as exc:
            message = f"Invalid JSON payload received. {exc.msg} at line {exc.lineno}."
            raise invalid(message, reason="parseError") from exc
        if not isinstance(body, dict):
            raise invalid("Invalid JSON payload received. The request body must be a JSON object.")
        return body


@dataclass
class Reply:
    """An answer: HTTP status and JSON body."""

    status: int
    body: Any


# A handler takes the running Sandbox (sandbox.context, which builds on this module) and the call.
Handler = Callable[[Any, Call], Awaitable[Reply]]
_VARIABLE = re.compile(r"\{(\w+)\}")


def compile_template(template: str) -> re.Pattern[str]:
    """A REST path template as a regular expression with one named group per variable."""
    pattern, last = "", 0
    for match in _VARIABLE.finditer(template):
        pattern += re.escape(template[last : match.start()]) + f"(?P<{match.group(1)}>[^/:]+)"
        last = match.end()
    return re.compile("^" + pattern + re.escape(template[last:]) + "$")


@dataclass(frozen=True)
class Route:
    """One REST method: HTTP method, path template, the API it belongs to, and its handler."""

    method: str
    template: str
    service: str
    handler: Handler
    pattern: re.Pattern[str]


class Router:
    """Maps (method, path) to a route; every API module registers its routes here."""

    def __init__(self) -> None:
        self.routes: list[Route] = []

    def add(self, method: str, template: str, service: str, handler: Handler) -> None:
        """Register a handler for a method and path template."""
        self.routes.append(Route(method.upper(), template, service, handler, compile_template(template)))

    def match(self, method: str, path: str) -> tuple[Route, dict[str, str]]:
        """The route of a request and its path variables; 404 as Google answers an unknown method or path."""
        for route in self.routes:
            found = route.pattern.match(path)
            if found and route.method == method.upper():
                return route, found.groupdict()
        raise not_found(f"The requested URL {path} ({method}) was not found on this server.")


def reply(body: Any, status: int = 200) -> Reply:
    """A JSON answer (200 unless told)."""
    return Reply(status, body)


def error_reply(error: ApiError) -> Reply:
    """Google's error JSON for an :class:`ApiError`."""
    return Reply(error.http, error.to_json())
