"""The deployment's own settings: what an Airflow admin decides and a run conf may not.

A run conf is written by whoever may trigger the DAG, so it never decides where a secret goes (DESIGN rule 8). The
connections that hold the Hugging Face token and the W&B key, any Ray dashboard endpoint other than the run's own
head service, where a privileged NCCL installer may be downloaded from, and the bounds of where a run may act and how
many GPU nodes it may hold (projects, regions, export buckets, recipes) are settings of the deployment: the
``[nemo_rl_gke]`` section of the Airflow config (``AIRFLOW__NEMO_RL_GKE__<NAME>`` in the environment).

The allowed projects are the ones listed plus the project the Google connection names (its ``project`` extra):
the project the deployment's credentials were set up for. It is read from the connection, without any call to
Google, so the offline ``validate`` can judge it (the CLI reads the same ``AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT``).

They are read at run time only, never while a DAG file is parsed, and passed explicitly as a frozen
:class:`Deployment` to the functions that need them (tests pass their own). Outside Airflow (the CLI) the same
environment variables are read, and every setting has a safe default.
"""

from __future__ import annotations

import ipaddress
import json
import math
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any
from urllib.parse import SplitResult, parse_qs, urlsplit

from nemo_rl_gke.run.airflow_settings import (
    CONN_ID,
    DEFAULT_MAX_ACTIVE_RUNS,
    ENV_PREFIX,
    MAX_ACTIVE_RUNS_CEILING,
    SECTION,
    DeploymentError,
    max_active_runs_problem,
    whole_number,
)
from nemo_rl_gke.run.conf_schema import CAPACITIES, PUBLISH_POLICIES

DEFAULT_DEPLOYMENT_ID = "default"
DEFAULT_HF_CONN_IDS = ("huggingface_default",)
DEFAULT_WANDB_CONN_IDS = ("wandb_default",)
# The tutorial applies the installer from Google's repository; both spellings of its raw URL are in use.
TUTORIAL_INSTALLER_URLS = (
    "https://raw.githubusercontent.com/GoogleCloudPlatform/container-engine-accelerators/master/gpudirect-rdma/"
    "nccl-rdma-installer.yaml",
    "https://raw.githubusercontent.com/GoogleCloudPlatform/container-engine-accelerators/refs/heads/master/"
    "gpudirect-rdma/nccl-rdma-installer.yaml",
)
# Ownership stamps it on labels, whose values are at most 63 lowercase letters, digits, '_' and '-' (FACTS §15).
DEPLOYMENT_ID = re.compile(r"[a-z][a-z0-9_-]{0,62}")
LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain"})
DEFAULT_GCP_CONN_ID = "google_cloud_default"
# A Deployment built in code without reading a connection (tests, library callers) stands for a Google connection
# that names the tutorial's project; load_deployment() and from_env() always read the real connection instead.
TUTORIAL_PROJECT = "nemo-rl-demo"
DEFAULT_ALLOWED_REGIONS = ("us-central1",)
# Placeholder in allowed_export_buckets for the run's own (allowed) project.
PROJECT_PLACEHOLDER = "{project}"
DEFAULT_EXPORT_BUCKETS = (f"{PROJECT_PLACEHOLDER}-nemo-rl-checkpoints",)
# The tutorial's size: 2 x a4-highgpu-8g (16 B200). Two such runs at once by default.
DEFAULT_MAX_GPU_NODES_PER_RUN = 2
DEFAULT_MAX_GPU_NODES_TOTAL = 4
GPU_NODES_CEILING = 1024
# Node-loss recoveries: how many one run may make (a conf's max_recoveries may only be lower), and the ceiling.
DEFAULT_MAX_RECOVERIES = 5
RECOVERIES_CEILING = 20
# Runs of the manual DAG at once: each its own run group, lease and GPU pool (bench/many_runs.py measures 20).
BUCKET_ENTRY = re.compile(r"[a-z0-9._-]+\*?")
PROJECT_ENTRY = re.compile(r"[a-z][a-z0-9-]{4,28}[a-z0-9]")
REGION_ENTRY = re.compile(r"[a-z]+-[a-z]+[0-9]+")
RECIPE_ENTRY = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
# A run's budget: a day covers the tutorial (about 2 h of provisioning and training on 2 A4 nodes), and 5,000 USD
# is about 28 h of those 2 nodes at the report's B200 price (176 USD/h), so the hours bind first; a deployment that
# allows 33 nodes (about 2,900 USD/h) stops such a run within 2 h.
DEFAULT_MAX_RUN_HOURS = 24.0
DEFAULT_MAX_RUN_SPEND = 5000.0  # USD
# How far past a budget or the job timeout a run may go to finish NeMo RL's deadline save (a day at most).
MAX_OVERRUN_MINUTES = 24 * 60


class EndpointNotAllowedError(ValueError):
    """An endpoint that would receive a token or a secret is not https, or plain http off loopback."""


def is_loopback_url(url: str | None) -> bool:
    """Whether ``url`` names a loopback host (127.0.0.0/8, ::1 or localhost), the only place plain http may go."""
    if not url:
        return False
    try:
        host = urlsplit(url).hostname or ""
    except ValueError:
        return False
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _parts(url: str, what: str) -> SplitResult:
    try:
        parts = urlsplit(url)
        _ = parts.port  # raises on a malformed port
    except ValueError as exc:
        raise EndpointNotAllowedError(f"{what} is not a URL ({exc})") from None
    if parts.username is not None or parts.password is not None:
        raise EndpointNotAllowedError(f"{what} must not carry credentials in the URL")
    return parts


def check_https(url: str, what: str) -> None:
    """Refuse anything but an https URL with a host: a GKE API server (and so its service proxy) is https only,
    the sandbox's included, and gets the Google bearer token."""
    parts = _parts(url, what)
    if parts.scheme != "https" or not parts.hostname:
        raise EndpointNotAllowedError(
            f"{what} is {url!r}: a GKE API server is served over https only (its certificate signed by the "
            "cluster's CA, masterAuth.clusterCaCertificate), and the Google bearer token goes nowhere else"
        )


def check_endpoint(url: str, google_endpoint: str | None, what: str) -> None:
    """Refuse a deployment's endpoint (``ray_dashboard_url``) that would carry secrets in the clear.

    https is always allowed (the clients verify its certificate). Plain http is allowed only to a loopback host, and
    only when the Google connection's endpoint is itself loopback: the local sandbox, never a real deployment.
    """
    parts = _parts(url, what)
    if parts.scheme == "https" and parts.hostname:
        return
    if parts.scheme == "http" and parts.hostname:
        if is_loopback_url(url) and is_loopback_url(google_endpoint):
            return
        raise EndpointNotAllowedError(
            f"{what} is plain http to {parts.hostname}: http is allowed only to loopback, and only when the Google "
            "connection's endpoint is loopback too (the local sandbox); use https"
        )
    raise EndpointNotAllowedError(f"{what} must be an https:// URL (got scheme {parts.scheme or 'none'!r})")


def installer_url_problem(url: str, allowlist: tuple[str, ...]) -> str:
    """Why ``url`` may not serve the NCCL installer ('' when it may): https, no tricks, and on the allowlist.

    An allowlist entry ending in ``/`` is a prefix; any other entry must match the whole URL.
    """
    try:
        parts = urlsplit(url)
    except ValueError:
        return "it is not a URL"
    if parts.scheme != "https":
        return f"the scheme is {parts.scheme or 'missing'}, not https"
    if not parts.hostname or "@" in parts.netloc:
        return "it has no host, or carries credentials"
    if parts.fragment or "\\" in url or not url.isprintable() or " " in url:
        return "it has a fragment, a backslash or non-printable characters"
    # A server (or a proxy) may normalise these away and serve a file outside the allowed prefix.
    path = parts.path.lower()
    if "%2e" in path or "%2f" in path or "%5c" in path or any(seg in (".", "..") for seg in parts.path.split("/")):
        return "its path has '.' or '..' segments or encoded separators"
    for entry in allowlist:
        if url == entry or (entry.endswith("/") and url.startswith(entry)):
            return ""
    return "it is not on the deployment's NCCL installer allowlist"


@dataclass(frozen=True)
class Deployment:
    """What the deployment decides, never the run conf. Build it with :func:`load_deployment` at run time.

    - ``deployment_id``: who this Airflow deployment is, stamped on every resource and lease it owns (two Airflows
      sharing a project need different ids): a label value, lowercase, at most 63 characters; default ``default``.
    - ``hf_conn_ids`` / ``wandb_conn_ids``: the Airflow connections whose password may be read as the HF token / the
      W&B key. A conf may pick one of them (the first is the default) and nothing else.
    - ``ray_dashboard_url``: a Ray dashboard to submit to instead of the run's head service through the Kubernetes
      API server. https only; plain http only to loopback when the Google connection is loopback (the sandbox).
    - ``nccl_installer_allowlist``: https URLs (an entry ending in ``/`` is a prefix) a conf may name as its
      ``nccl_installer_source``; redirects must stay on it.
    - ``alert_conn_ids``: the Airflow connections run alerts may go to (a schedule may pick a subset); empty: alerts
      are only logged.
    - ``allowed_projects``: projects a conf may name besides ``gcp_project``; ``allowed_regions``: regions it may
      name (its zone must lie in one).
    - ``allowed_export_buckets``: buckets the checkpoint may be exported to: exact names, or prefixes ending in
      ``*``; ``{project}`` stands for the run's project (default: the derived ``{project}-nemo-rl-checkpoints``).
    - ``max_gpu_nodes_per_run``: the most GPU nodes one run's pool may hold; ``max_gpu_nodes_total``: the most this
      deployment's live runs in a project may hold together, enforced when a run takes its group's lease.
    - ``max_run_hours`` / ``max_run_usd``: the most one run may last (from its start, provisioning included) and
      spend (the run report's cost model: GPU price per hour x GPU nodes); a conf may only lower them. 0: no limit.
    - ``budget_overrun_minutes``: how long past a budget or the job timeout the trigger may wait for NeMo RL's
      deadline save, when the job's setup took longer than was reserved for it (never past a capacity's end). 0:
      the job is stopped at the deadline, and a stop before any save says what it lost.
    - ``allowed_recipes``: recipes a conf may pick; empty: every recipe shipped in include/recipes.
    - ``max_recoveries``: the most node-loss recoveries (resubmissions) a conf's ``max_recoveries`` may ask for.
    - ``allowed_capacity``: the GPU capacity options a conf's ``capacity`` and ``capacity_ladder`` may use;
      ``max_gpu_hour_usd``: the most a GPU-hour of any of them may cost at the price table's estimate. 0: no limit.
    - ``max_active_runs``: how many runs of the manual DAG may be active at once (read when the DAG file is
      parsed: :func:`nemo_rl_gke.run.airflow_settings.max_active_runs`).
    - ``allowed_publish``: the publish policies a conf may pick (drop ``always`` so that only a model that scores
      better than the last published one is published).
    - ``gcp_project``: not a ``[nemo_rl_gke]`` setting but the ``project`` extra of the Google connection, read by
      :func:`load_deployment` / :meth:`from_env`; always an allowed project ('' when the connection names none).
    """

    deployment_id: str = DEFAULT_DEPLOYMENT_ID
    hf_conn_ids: tuple[str, ...] = DEFAULT_HF_CONN_IDS
    wandb_conn_ids: tuple[str, ...] = DEFAULT_WANDB_CONN_IDS
    ray_dashboard_url: str = ""
    nccl_installer_allowlist: tuple[str, ...] = TUTORIAL_INSTALLER_URLS
    alert_conn_ids: tuple[str, ...] = ()
    allowed_projects: tuple[str, ...] = ()
    allowed_regions: tuple[str, ...] = DEFAULT_ALLOWED_REGIONS
    allowed_export_buckets: tuple[str, ...] = DEFAULT_EXPORT_BUCKETS
    max_gpu_nodes_per_run: int = DEFAULT_MAX_GPU_NODES_PER_RUN
    max_gpu_nodes_total: int = DEFAULT_MAX_GPU_NODES_TOTAL
    max_run_hours: float = DEFAULT_MAX_RUN_HOURS
    max_run_usd: float = DEFAULT_MAX_RUN_SPEND
    budget_overrun_minutes: float = 0.0
    allowed_recipes: tuple[str, ...] = ()
    max_recoveries: int = DEFAULT_MAX_RECOVERIES
    allowed_capacity: tuple[str, ...] = CAPACITIES
    max_gpu_hour_usd: float = 0.0
    allowed_publish: tuple[str, ...] = PUBLISH_POLICIES
    max_active_runs: int = DEFAULT_MAX_ACTIVE_RUNS
    gcp_project: str = TUTORIAL_PROJECT

    def __post_init__(self) -> None:
        problems = list(self._problems())
        if problems:
            raise DeploymentError(
                f"[{SECTION}] settings are not valid: " + "; ".join(problems) + f". Fix them in airflow.cfg or "
                f"{ENV_PREFIX}<NAME>"
            )

    def _problems(self) -> list[str]:
        problems = []
        if not DEPLOYMENT_ID.fullmatch(self.deployment_id):
            problems.append("deployment_id must be 1-63 lowercase letters, digits, '_' or '-', starting with a letter")
        for name in ("hf_conn_ids", "wandb_conn_ids"):
            ids = getattr(self, name)
            if not ids or not all(isinstance(i, str) and CONN_ID.fullmatch(i) for i in ids):
                problems.append(f"{name} must list at least one connection id of letters, digits, '_', '.' or '-'")
        bad = [i for i in self.alert_conn_ids if not (isinstance(i, str) and CONN_ID.fullmatch(i))]
        if bad:
            problems.append(
                f"alert_conn_ids has {', '.join(repr(str(i)[:80]) for i in bad)}: each must be a connection id of "
                "letters, digits, '_', '.' or '-' (comma-separated; empty for logging only)"
            )
        problems += self._url_problems()
        for name in ("max_run_hours", "max_run_usd", "max_gpu_hour_usd"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < math.inf:
                problems.append(f"{name} must be a number >= 0 (0: no limit), got {str(value)[:40]!r}")
        value = self.budget_overrun_minutes
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= MAX_OVERRUN_MINUTES:
            problems.append(
                f"budget_overrun_minutes must be a number from 0 to {MAX_OVERRUN_MINUTES} (0: never past a budget), "
                f"got {str(value)[:40]!r}"
            )
        return problems + self._bound_problems()

    def _url_problems(self) -> list[str]:
        """The Ray dashboard URL and the NCCL installer allowlist: https, no credentials, no query."""
        problems = []
        if self.ray_dashboard_url:
            parts = urlsplit(self.ray_dashboard_url)
            if parts.scheme not in ("https", "http") or not parts.hostname or parts.username is not None:
                problems.append("ray_dashboard_url must be an https:// URL without credentials (or empty)")
            elif parts.scheme == "http" and not is_loopback_url(self.ray_dashboard_url):
                # Refused now, not at the first submit after the infrastructure was built.
                problems.append("ray_dashboard_url is plain http off loopback: use https (http only for the sandbox)")
        for entry in self.nccl_installer_allowlist:
            problem = installer_url_problem(entry, (entry,))
            if problem or urlsplit(entry).query:
                problems.append(f"nccl_installer_allowlist entry {entry[:80]!r} is not a plain https URL")
        return problems

    def _bound_problems(self) -> list[str]:
        problems = []
        for name, pattern, what in (
            ("allowed_projects", PROJECT_ENTRY, "a project ID"),
            ("allowed_regions", REGION_ENTRY, "a region such as us-central1"),
            ("allowed_recipes", RECIPE_ENTRY, "a recipe name"),
        ):
            bad = [e for e in getattr(self, name) if not (isinstance(e, str) and pattern.fullmatch(e))]
            if bad:
                problems.append(f"{name} has {', '.join(repr(str(e)[:80]) for e in bad)}: each must be {what}")
        bad = [
            e
            for e in self.allowed_export_buckets
            if not (isinstance(e, str) and BUCKET_ENTRY.fullmatch(e.replace(PROJECT_PLACEHOLDER, "p")))
        ]
        if bad:
            problems.append(
                f"allowed_export_buckets has {', '.join(repr(str(e)[:80]) for e in bad)}: each must be a bucket "
                f"name, or a prefix ending in '*', where {PROJECT_PLACEHOLDER} stands for the run's project"
            )
        for name in ("max_gpu_nodes_per_run", "max_gpu_nodes_total"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= GPU_NODES_CEILING:
                problems.append(f"{name} must be a whole number from 1 to {GPU_NODES_CEILING} (got {str(value)[:40]})")
        problem = max_active_runs_problem(self.max_active_runs)
        if problem:
            problems.append(problem)
        value = self.max_recoveries
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= RECOVERIES_CEILING:
            problems.append(
                f"max_recoveries must be a whole number from 0 to {RECOVERIES_CEILING} (got {str(value)[:40]})"
            )
        bad_publish = [e for e in self.allowed_publish if e not in PUBLISH_POLICIES]
        if bad_publish or not self.allowed_publish:
            problems.append(
                f"allowed_publish has {', '.join(repr(str(e)[:80]) for e in bad_publish) or 'nothing'}: it must "
                f"list at least one of {', '.join(PUBLISH_POLICIES)}"
            )
        bad = [e for e in self.allowed_capacity if e not in CAPACITIES]
        if bad or not self.allowed_capacity:
            problems.append(
                f"allowed_capacity has {', '.join(repr(str(e)[:80]) for e in bad) or 'nothing'}: it must list at "
                f"least one of {', '.join(CAPACITIES)}"
            )
        # gcp_project is not checked: a domain-scoped project (example.com:p) is valid there and matches no conf.
        return problems

    @property
    def projects(self) -> tuple[str, ...]:
        """Every project a conf may name: the Google connection's project first, then ``allowed_projects``."""
        first = (self.gcp_project,) if self.gcp_project else ()
        return first + tuple(p for p in self.allowed_projects if p != self.gcp_project)

    def export_buckets(self, project: str) -> tuple[str, ...]:
        """The allowed export buckets of a run in ``project`` (``{project}`` filled in; '*' ends a prefix)."""
        return tuple(e.replace(PROJECT_PLACEHOLDER, project) for e in self.allowed_export_buckets)

    def bucket_allowed(self, bucket: str, project: str) -> bool:
        """Whether a run in ``project`` may export to ``bucket``: an exact entry, or below a prefix ending in '*'."""
        for entry in self.export_buckets(project):
            if bucket == entry or (entry.endswith("*") and bucket.startswith(entry[:-1])):
                return True
        return False

    @property
    def default_hf_conn_id(self) -> str:
        """The connection of the HF token when the conf names none."""
        return self.hf_conn_ids[0]

    @property
    def default_wandb_conn_id(self) -> str:
        """The connection of the W&B key when the conf names none."""
        return self.wandb_conn_ids[0]

    def hf_conn_id(self, requested: str) -> str:
        """The connection to read the HF token from: ``requested`` if allowed ('' means the default), else raise."""
        return _allowed(requested, self.hf_conn_ids, "hf_conn_id")

    def wandb_conn_id(self, requested: str) -> str:
        """The connection to read the W&B key from: ``requested`` if allowed ('' means the default), else raise."""
        return _allowed(requested, self.wandb_conn_ids, "wandb_conn_id")

    def installer_url_problem(self, url: str) -> str:
        """Why ``url`` may not serve the NCCL installer in this deployment ('' when it may)."""
        return installer_url_problem(url, self.nccl_installer_allowlist)

    @classmethod
    def from_settings(cls, get: Callable[[str], str | None], gcp_project: str = "") -> Deployment:
        """Build from a lookup of raw setting strings by name (None or '' when unset: the default applies) and the
        Google connection's project ('' when it names none)."""
        values: dict[str, Any] = {"gcp_project": gcp_project.strip()}
        for f in fields(cls):
            raw = get(f.name) if f.name != "gcp_project" else None
            if raw is None or not raw.strip():
                continue
            if isinstance(f.default, tuple):
                values[f.name] = _split(raw)
            elif isinstance(f.default, float):
                values[f.name] = _number(raw)
            elif isinstance(f.default, int):
                values[f.name] = whole_number(raw, f.name)
            else:
                values[f.name] = raw.strip()
        return cls(**values)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, gcp_conn_id: str = DEFAULT_GCP_CONN_ID) -> Deployment:
        """Read ``AIRFLOW__NEMO_RL_GKE__<NAME>`` and the Google connection's ``AIRFLOW_CONN_<ID>`` from the
        environment: the CLI's source, outside Airflow."""
        env = os.environ if environ is None else environ
        project = connection_project(env.get(f"AIRFLOW_CONN_{gcp_conn_id.upper()}"))
        return cls.from_settings(lambda name: env.get(ENV_PREFIX + name.upper()), project)


class ConnectionNotAllowedError(ValueError):
    """A connection id that the deployment does not allow for this secret."""


def _allowed(requested: str, allowed: tuple[str, ...], param: str) -> str:
    if not requested:
        return allowed[0]
    if requested in allowed:
        return requested
    raise ConnectionNotAllowedError(
        f"{param}: the deployment allows only {', '.join(allowed)} for this secret; no other connection is read"
    )


def connection_project(value: str | None) -> str:
    """The ``project`` extra of a connection given as an ``AIRFLOW_CONN_*`` value (JSON or URI); '' when none."""
    if not value or not value.strip():
        return ""
    text = value.strip()
    if text.startswith("{"):
        try:
            record = json.loads(text)
        except ValueError:
            return ""
        extra = record.get("extra") if isinstance(record, dict) else None
        if isinstance(extra, str):
            try:
                extra = json.loads(extra)
            except ValueError:
                return ""
        return project_of_extra(extra)
    try:
        query = parse_qs(urlsplit(text).query)
    except ValueError:
        return ""
    return project_of_extra({k: v[0] for k, v in query.items()})


def project_of_extra(extra: Any) -> str:
    """The project a Google connection's extras name (``project``, or the provider's older prefixed spelling)."""
    if not isinstance(extra, Mapping):
        return ""
    for key in ("project", "extra__google_cloud_platform__project"):
        found = extra.get(key)
        if isinstance(found, str) and found.strip():
            return found.strip()
    return ""


def _split(raw: str) -> tuple[str, ...]:
    # Comma- or whitespace-separated, so a list fits on one env var line or spans lines in airflow.cfg.
    return tuple(part for part in re.split(r"[\s,]+", raw.strip()) if part)


def _number(raw: str) -> float | str:
    # A setting that is not a number stays a string, so __post_init__ names it in its error.
    try:
        return float(raw.strip())
    except ValueError:
        return raw.strip()


def load_deployment(gcp_conn_id: str = DEFAULT_GCP_CONN_ID) -> Deployment:
    """The deployment's settings, read now from the Airflow config (``[nemo_rl_gke]``, env included), and the
    project of the Google connection ``gcp_conn_id`` through Airflow's connection API (no call to Google).

    Call it at run time (in ``execute``), never at DAG parse time. Without Airflow installed it reads the
    environment variables instead; unset settings take their defaults.
    """
    try:
        from airflow.configuration import conf  # lazy: importing it costs a second and never happens at parse time
        from airflow.sdk import BaseHook
    except ImportError:
        return Deployment.from_env(gcp_conn_id=gcp_conn_id)
    try:
        project = project_of_extra(BaseHook.get_connection(gcp_conn_id).extra_dejson)
    except Exception:
        project = ""  # no such connection: only allowed_projects is allowed
    return Deployment.from_settings(lambda name: conf.get(SECTION, name, fallback=None), project)


SETTINGS_DOC: tuple[tuple[str, str, str], ...] = (
    (
        "deployment_id",
        DEFAULT_DEPLOYMENT_ID,
        "Who this Airflow deployment is: every resource and object a run creates records it, and teardown deletes "
        "only its own deployment's. Two Airflows sharing a project need different ids. A label value: 1-63 "
        "lowercase letters, digits, '_' or '-', starting with a letter.",
    ),
    (
        "hf_conn_ids",
        ",".join(DEFAULT_HF_CONN_IDS),
        "Connections whose password may be read as the Hugging Face token (comma-separated; the first is the "
        "default). A conf's hf_conn_id must be one of them or empty.",
    ),
    (
        "wandb_conn_ids",
        ",".join(DEFAULT_WANDB_CONN_IDS),
        "Connections whose password may be read as the W&B API key (comma-separated; the first is the default). A "
        "conf's wandb_conn_id must be one of them or empty.",
    ),
    (
        "ray_dashboard_url",
        "",
        "Submit the Ray job here instead of to the run's head service through the Kubernetes API server proxy. "
        "https only (the certificate is verified); plain http only to loopback when the Google connection's "
        "endpoint is loopback (the sandbox).",
    ),
    (
        "nccl_installer_allowlist",
        " ".join(TUTORIAL_INSTALLER_URLS),
        "https URLs a conf's nccl_installer_source may name (whitespace- or comma-separated); an entry ending in "
        "'/' allows every URL below it. Redirects must stay on the list.",
    ),
    (
        "alert_conn_ids",
        "",
        "Connections that run alerts (a failed run, a scheduled run past its deadline) are sent to, comma-separated; "
        "a schedule may name a subset. The connection type picks the notifier: http (a JSON POST, "
        "apache-airflow-providers-http), slackwebhook or slack (the Slack provider, if installed), smtp (the SMTP "
        "provider; recipients in the connection extra 'to'). Empty: alerts are only written to the task log. See "
        "docs/alerts.md.",
    ),
)


BOUND_SETTINGS_DOC: tuple[tuple[str, str, str], ...] = (
    (
        "allowed_projects",
        "",
        "Projects a conf's project may name, besides the one the Google connection names (its 'project' extra, "
        "read through Airflow's connection API, with no call to Google), which is always allowed. Comma- or "
        "whitespace-separated. With neither, every conf is refused.",
    ),
    (
        "allowed_regions",
        ",".join(DEFAULT_ALLOWED_REGIONS),
        "Regions a conf's region may name (its zone must lie in the region), comma-separated.",
    ),
    (
        "allowed_export_buckets",
        ",".join(DEFAULT_EXPORT_BUCKETS),
        "Buckets the trained checkpoint may be exported to (the Lustre service agent writes there): exact names, or "
        "prefixes ending in '*'; {project} stands for the run's own, allowed, project. The default allows only "
        "the derived bucket {project}-nemo-rl-checkpoints.",
    ),
    (
        "max_gpu_nodes_per_run",
        str(DEFAULT_MAX_GPU_NODES_PER_RUN),
        "The most GPU nodes one run may hold: its pool's ceiling, max(worker_replicas, gpu_pool_max_nodes) (the "
        "generation nodes are part of worker_replicas). The default is the tutorial's 2 x a4-highgpu-8g.",
    ),
    (
        "max_gpu_nodes_total",
        str(DEFAULT_MAX_GPU_NODES_TOTAL),
        "The most GPU nodes this deployment's live runs in one project may hold together. Each run's lease records "
        "its GPU nodes; taking a lease counts the others' under the same fingerprint-guarded metadata write, so two "
        "runs cannot pass it even when they start together. A run that would waits, fails or skips per lease_held.",
    ),
    (
        "max_run_hours",
        f"{DEFAULT_MAX_RUN_HOURS:g}",
        "The longest a run may last, counted from its start (provisioning spends budget too). Training is given "
        "NeMo RL's checkpointing.checkpoint_must_save_by from the time left, so it saves and exits in time; the "
        "trigger stops the job at its next save when the budget is near (at once when it is spent), then the "
        "checkpoint is validated and exported. A conf's max_run_hours may only lower it. 0: no limit.",
    ),
    (
        "max_run_usd",
        f"{DEFAULT_MAX_RUN_SPEND:g}",
        "The most a run may spend, in USD at the run report's prices (the serving capacity's price per GPU-hour x "
        "GPUs, from when the GPU pool came up). Training saves and stops before it as before max_run_hours. A "
        "conf's max_run_usd may only lower it. 0: no limit.",
    ),
    (
        "budget_overrun_minutes",
        "0",
        f"How long past max_run_hours, max_run_usd or the job timeout a run may go to finish NeMo RL's deadline save "
        f"when the job's setup (model load) took longer than was reserved for it; never past flex-start's end. 0: "
        f"the job is stopped at the deadline, and a stop before any save names the steps and GPU-hours it lost. At "
        f"most {MAX_OVERRUN_MINUTES}.",
    ),
    (
        "allowed_recipes",
        "",
        "Recipes a conf may pick (comma-separated); empty allows every recipe shipped in include/recipes.",
    ),
    (
        "max_recoveries",
        str(DEFAULT_MAX_RECOVERIES),
        "The most times one run may resubmit its job after a lost node (a conf's max_recoveries may only be lower; "
        "0: never). Each recovery waits for the replacement node, so it spends the run's budget too.",
    ),
    (
        "allowed_capacity",
        ",".join(CAPACITIES),
        "The GPU capacity options a conf's capacity and every rung of its capacity_ladder may use, comma-separated "
        "(reservation, flex_start, queued, spot, on_demand). Drop spot, say, where a preempted node is not acceptable.",
    ),
    (
        "max_gpu_hour_usd",
        "0",
        "The most a GPU-hour may cost on any capacity a run may use, at the price table's estimate for the GPU and "
        "the option (run/costs.py; a conf's gpu_hour_price_usd does not count, since the conf writes it). 0: no "
        "limit. For example 6 allows B200 flex-start and Spot but not on-demand or reservation list prices.",
    ),
    (
        "max_active_runs",
        str(DEFAULT_MAX_ACTIVE_RUNS),
        f"How many runs of the manual DAG may be active at once (each its own run group, lease and GPU pool; a "
        f"scheduled DAG runs one at a time). Read when the DAG file is parsed. From 1 to {MAX_ACTIVE_RUNS_CEILING}; "
        "docs/request-budget.md says what a project's default quotas carry.",
    ),
    (
        "allowed_publish",
        ",".join(PUBLISH_POLICIES),
        "The publish policies a conf may pick, comma-separated (always, if_better, never): drop always so that only a "
        "model that scores at least the last published one's (plus the conf's publish_margin) gets the published-"
        "model Asset event. Every run's checkpoint is exported whatever the policy.",
    ),
)
SETTINGS_DOC = SETTINGS_DOC + BOUND_SETTINGS_DOC
# Who may change a bound: named in every finding that refuses a conf on one.
WHO_CHANGES = "the deployment's operator (an Airflow admin: airflow.cfg or the environment variable named)"


def settings_markdown() -> str:
    """The deployment settings as a Markdown table: name, environment variable, default, meaning."""
    lines = ["| setting | environment variable | default | meaning |", "| --- | --- | --- | --- |"]
    for name, default, meaning in SETTINGS_DOC:
        shown = f"`{default}`" if default else "(empty)"
        lines.append(f"| `{name}` | `{ENV_PREFIX}{name.upper()}` | {shown} | {meaning} |")
    return "\n".join(lines) + "\n"
