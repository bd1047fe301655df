"""The admin API under ``/sandbox/`` (JSON): health, faults, inventory, call log, seeding, latency, reset.

These calls are neither logged nor subject to faults. Bodies and answers use snake_case: they are the sandbox's own,
not Google's.

- ``GET /sandbox/health``: ``{"status": "ok", "pid", "url", "state_dir", "latency_scale", ...}``.
- ``GET|POST|DELETE /sandbox/faults``, ``DELETE /sandbox/faults/{id}``: see :mod:`sandbox.faults`.
- ``GET /sandbox/inventory``: every live resource (kind, name, path, state, phase, labels, description, operation;
  a Lustre instance's ``data_dir``) and, apart, what was seeded (reservations, network profiles, enabled services).
  Kinds: ``compute.network|subnetwork|firewall|address``, ``servicenetworking.connection`` (named after the network
  it peers; the API gives it no labels or description), ``lustre.instance``, ``container.cluster|nodePool``. Apart:
  ``kubernetes`` (every object a client made in a cluster's API) and ``ray_heads`` (every local Ray with its PID).
- ``GET /sandbox/calls?since=N``, ``DELETE /sandbox/calls``: the API call log.
- ``GET /sandbox/operations``: every operation (id, service, kind, target, start, end, status, error).
- ``POST /sandbox/seed``: a seed document (see :mod:`sandbox.config`), applied now.
- ``GET|POST /sandbox/reservations``: list, or add one ``{"project", "zone", "name", "machine_type", "count", ...}``.
- ``POST /sandbox/services``: ``{"service": "lustre.googleapis.com", "enabled": false}``.
- ``GET|POST /sandbox/latency``: the latency model; POST ``{"scale": 0.01, "seconds": {"kind": s}}`` changes it,
  ``"defaults": true`` first drops every per-kind override (seeded ones included).
- ``GET|POST /sandbox/node-loss``: list, or lose one worker node of a RayCluster ``{"raycluster", "namespace"
  (optional), "mode": "killed" | "frozen" | "preempted" (a Spot node only; "notice_s": 30) | "ended",
  "replace_after_s": 5, "after_save": 10 (optional: as soon as the checkpoint
  step_10 is on its Lustre volume)}`` (see :mod:`sandbox.kuberay`).
- ``POST /sandbox/reset``: forget every resource, operation, fault and call (the seeded config stays).
- ``GET /sandbox/credentials``: the service-account JSON key file (see :mod:`sandbox.auth`), made on first use and
  kept in the state dir; its ``token_uri`` is this sandbox's token endpoint.
- ``GET|POST /sandbox/auth``: token lifetime, tokens issued so far; POST ``{"token_lifetime_s": 5}`` changes the
  lifetime of tokens issued (and self-signed JWTs checked) from now on.
"""

from __future__ import annotations

import dataclasses
import os
from typing import TYPE_CHECKING, Any

from sandbox import formats
from sandbox.apis import STATES, compute
from sandbox.config import Reservation, SeedError
from sandbox.errors import ApiError, invalid, not_found
from sandbox.faults import FaultSpecError
from sandbox.http import Call, Reply, Router, reply
from sandbox.kuberay import PREEMPTION_NOTICE_S
from sandbox.operations import LatencyModel
from sandbox.quotas import RATE_QUOTAS, RateLimiter
from sandbox.store import Resource

if TYPE_CHECKING:
    from sandbox.context import Sandbox

SERVICE = "sandbox"


async def health(sb: Sandbox, call: Call) -> Reply:
    """Liveness, and where things are."""
    return reply(
        {
            "status": "ok",
            "pid": os.getpid(),
            "url": sb.url,
            "state_dir": str(sb.state_dir),
            "latency_scale": sb.latency_scale,
            "resources": len(sb.store.resources),
            "operations": len(sb.store.operations),
        }
    )


async def list_faults(sb: Sandbox, call: Call) -> Reply:
    """Every installed fault with its counters."""
    return reply({"faults": [f.to_json() for f in sb.faults.list()]})


async def add_fault(sb: Sandbox, call: Call) -> Reply:
    """Install a fault."""
    try:
        fault = sb.faults.add(call.json())
    except FaultSpecError as exc:
        raise invalid(f"fault: {exc}") from exc
    return reply(fault.to_json(), 201)


async def clear_faults(sb: Sandbox, call: Call) -> Reply:
    """Uninstall every fault."""
    sb.faults.clear()
    return reply({})


async def delete_fault(sb: Sandbox, call: Call) -> Reply:
    """Uninstall one fault."""
    if not sb.faults.remove(call.params["fault"]):
        raise not_found(f"no fault {call.params['fault']}")
    return reply({})


def _labels(resource: Resource) -> dict[str, str]:
    body = resource.body
    return dict(body.get("labels") or body.get("resourceLabels") or body.get("config", {}).get("resourceLabels") or {})


def inventory_item(resource: Resource) -> dict[str, Any]:
    """One live resource with its owner marker (labels where the API has them, else the description)."""
    item: dict[str, Any] = {
        "kind": resource.kind,
        "name": resource.name,
        "path": resource.key,
        "state": STATES.get(resource.kind, {}).get(resource.phase, resource.phase.upper()),
        "phase": resource.phase,
        "labels": _labels(resource),
        "description": resource.body.get("description", ""),
        "operation": resource.op,
        "created": formats.rfc3339(resource.created),
    }
    if resource.kind == "lustre.instance":
        item["data_dir"] = resource.extra["data_dir"]
        item["mount_point"] = resource.body.get("mountPoint")
    return item


async def inventory(sb: Sandbox, call: Call) -> Reply:
    """Every live resource, oldest first, and what was seeded."""
    resources = sorted(sb.store.resources.values(), key=lambda r: (r.created, r.key))
    config = sb.store.config
    return reply(
        {
            "resources": [inventory_item(r) for r in resources],
            "kubernetes": sb.kube.inventory(),
            "ray_heads": sb.kuberay.inventory(),
            "seeded": {
                "reservations": [dataclasses.asdict(r) for r in config.reservations.values()],
                "network_profiles": [f"{zone}-vpc-roce" for zone in config.roce_zones],
                "enabled_services": list(config.enabled_services),
            },
        }
    )


async def list_calls(sb: Sandbox, call: Call) -> Reply:
    """The API call log, after sequence number ``since``."""
    return reply({"calls": sb.calls.since(int(call.arg("since") or 0))})


async def clear_calls(sb: Sandbox, call: Call) -> Reply:
    """Empty the call log."""
    sb.calls.clear()
    return reply({})


async def list_operations(sb: Sandbox, call: Call) -> Reply:
    """Every operation, oldest first, service-neutral."""
    at = sb.now()
    operations = []
    for operation in sorted(sb.store.operations.values(), key=lambda o: (o.start, o.id)):
        operations.append(
            {
                "id": operation.id,
                "service": operation.service,
                "kind": operation.kind,
                "target": operation.target,
                "outcome": operation.outcome,
                "status": operation.status(at),
                "start": operation.start,
                "end": operation.end,
                "duration": operation.duration,
                "error": operation.error,
            }
        )
    return reply({"operations": operations})


def _seed_error(exc: Exception) -> ApiError:
    return invalid(str(exc))


async def seed(sb: Sandbox, call: Call) -> Reply:
    """Apply a seed document now."""
    try:
        sb.store.config.apply_seed(call.json(), sb.now())
    except (SeedError, TypeError, ValueError) as exc:
        raise _seed_error(exc) from exc
    sb.store.dirty = True
    return reply({})


async def list_reservations(sb: Sandbox, call: Call) -> Reply:
    """Every seeded reservation, as compute renders it."""
    keys = sorted(sb.store.config.reservations)
    return reply({"reservations": [compute.render_reservation(sb, k) for k in keys]})


async def add_reservation(sb: Sandbox, call: Call) -> Reply:
    """Add or replace one reservation."""
    try:
        reservation = Reservation.from_seed(call.json(), sb.now())
    except (SeedError, TypeError, ValueError) as exc:
        raise _seed_error(exc) from exc
    sb.store.config.add_reservation(reservation)
    sb.store.dirty = True
    return reply(compute.render_reservation(sb, reservation.key), 201)


async def set_service(sb: Sandbox, call: Call) -> Reply:
    """Enable or disable one API."""
    body = call.json()
    service, enabled = body.get("service"), body.get("enabled")
    if not isinstance(service, str) or not isinstance(enabled, bool):
        raise invalid('give {"service": "NAME.googleapis.com", "enabled": true|false}')
    services = [s for s in sb.store.config.enabled_services if s != service]
    sb.store.config.enabled_services = [*services, service] if enabled else services
    sb.store.dirty = True
    return reply({"enabled_services": sb.store.config.enabled_services})


async def get_latency(sb: Sandbox, call: Call) -> Reply:
    """The latency model: scale and seconds per operation kind (what the makespan bench sums)."""
    return reply(sb.latency.to_json())


async def set_latency(sb: Sandbox, call: Call) -> Reply:
    """Change the scale and/or per-kind seconds for operations started from now on."""
    body = call.json()
    try:
        scale = float(body.get("scale", sb.latency_scale))
        seconds = {str(k): float(v) for k, v in body.get("seconds", {}).items()}
        LatencyModel(scale, seconds)
    except (TypeError, ValueError, AttributeError) as exc:
        raise invalid(f"latency: {exc}") from exc
    sb.latency_scale = scale
    if body.get("defaults"):
        sb.store.config.latency_seconds.clear()
    sb.store.config.latency_seconds.update(seconds)
    sb.store.dirty = True
    return reply(sb.latency.to_json())


async def credentials(sb: Sandbox, call: Call) -> Reply:
    """The service-account key file that gets tokens from this sandbox."""
    return reply(sb.auth.key_file(sb.url))


async def get_auth(sb: Sandbox, call: Call) -> Reply:
    """Token lifetime and how many tokens were issued."""
    return reply(sb.auth.to_json())


async def set_auth(sb: Sandbox, call: Call) -> Reply:
    """Change the token lifetime (tests shorten it to prove refresh)."""
    value = call.json().get("token_lifetime_s")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise invalid(f"token_lifetime_s must be a number of seconds > 0 (e.g. 5), got {value!r}")
    sb.auth.lifetime_s = float(value)
    return reply(sb.auth.to_json())


async def list_node_losses(sb: Sandbox, call: Call) -> Reply:
    """Every node loss asked for, with when it happened and its replacement."""
    return reply({"node_losses": sb.kuberay.node_losses()})


async def lose_node(sb: Sandbox, call: Call) -> Reply:
    """Lose one worker node of a RayCluster, now or at a step of its job (a host that dies, or hangs)."""
    body = call.json()
    raycluster, after_save = body.get("raycluster"), body.get("after_save")
    replace_after_s = body.get("replace_after_s", 5.0)
    notice_s = body.get("notice_s", PREEMPTION_NOTICE_S)
    if not isinstance(raycluster, str) or not raycluster:
        raise invalid(
            'give {"raycluster": "NAME", "mode": "killed" | "frozen" | "preempted" | "ended", "replace_after_s": 5}'
        )
    if after_save is not None and (isinstance(after_save, bool) or not isinstance(after_save, int) or after_save < 1):
        raise invalid(f"after_save must be a checkpoint step >= 1, got {after_save!r}")
    for name, value in (("replace_after_s", replace_after_s), ("notice_s", notice_s)):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise invalid(f"{name} must be a number of seconds, got {value!r}")
    try:
        loss = sb.kuberay.lose_node(
            raycluster,
            body.get("namespace"),
            str(body.get("mode", "killed")),
            float(replace_after_s),
            after_save,
            notice_s=float(notice_s),
        )
    except LookupError as exc:
        raise not_found(str(exc)) from exc
    except ValueError as exc:
        raise invalid(str(exc)) from exc
    return reply(loss.to_json(), 201)


async def get_capacity(sb: Sandbox, call: Call) -> Reply:
    """The GPU capacity model: its settings, the nodes made per pool, each reservation's free machines (change the
    settings with ``POST /sandbox/seed {"capacity": {...}}``)."""
    return reply(sb.kuberay.capacity.to_json())


async def reset(sb: Sandbox, call: Call) -> Reply:
    """Forget every resource, operation, fault, call and rate quota count; keep the seeded config."""
    sb.store.reset()
    sb.faults.clear()
    sb.calls.clear()
    sb.kuberay.losses.clear()
    sb.rates = RateLimiter()
    return reply({})


async def rates(sb: Sandbox, call: Call) -> Reply:
    """The rate quota groups (``sandbox.quotas``): each one's limit and interval, and the calls refused per project."""
    groups = {
        q.name: {"limit": int(sb.store.config.rate_quotas.get(q.name, q.default_limit)), "interval_s": q.interval_s}
        for q in RATE_QUOTAS
    }
    refused = [{"project": p, "group": g, "refused": n} for (p, g), n in sorted(sb.rates.refused.items())]
    return reply({"groups": groups, "refused": refused})


def router() -> Router:
    """The admin routes."""
    routes = Router()
    add = routes.add
    add("GET", "/sandbox/health", SERVICE, health)
    add("GET", "/sandbox/faults", SERVICE, list_faults)
    add("POST", "/sandbox/faults", SERVICE, add_fault)
    add("DELETE", "/sandbox/faults", SERVICE, clear_faults)
    add("DELETE", "/sandbox/faults/{fault}", SERVICE, delete_fault)
    add("GET", "/sandbox/inventory", SERVICE, inventory)
    add("GET", "/sandbox/calls", SERVICE, list_calls)
    add("GET", "/sandbox/rates", SERVICE, rates)
    add("DELETE", "/sandbox/calls", SERVICE, clear_calls)
    add("GET", "/sandbox/operations", SERVICE, list_operations)
    add("POST", "/sandbox/seed", SERVICE, seed)
    add("GET", "/sandbox/reservations", SERVICE, list_reservations)
    add("POST", "/sandbox/reservations", SERVICE, add_reservation)
    add("POST", "/sandbox/services", SERVICE, set_service)
    add("GET", "/sandbox/latency", SERVICE, get_latency)
    add("POST", "/sandbox/latency", SERVICE, set_latency)
    add("GET", "/sandbox/node-loss", SERVICE, list_node_losses)
    add("POST", "/sandbox/node-loss", SERVICE, lose_node)
    add("GET", "/sandbox/capacity", SERVICE, get_capacity)
    add("POST", "/sandbox/reset", SERVICE, reset)
    add("GET", "/sandbox/credentials", SERVICE, credentials)
    add("GET", "/sandbox/auth", SERVICE, get_auth)
    add("POST", "/sandbox/auth", SERVICE, set_auth)
    return routes
