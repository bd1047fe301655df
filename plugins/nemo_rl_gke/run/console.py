"""Google Cloud console addresses that more than the Airflow glue needs (the alerts and the Training view link the
Ray logs too): one builder each, shared with :mod:`nemo_rl_gke.links`. Pure and stdlib-only."""

from __future__ import annotations

from urllib.parse import quote

CONSOLE = "https://console.cloud.google.com"


def gcs_url(uri: str) -> str:
    """A ``gs://bucket/path/`` URI as its Cloud Storage browser page ('' for anything else)."""
    if not uri.startswith("gs://"):
        return ""
    return f"{CONSOLE}/storage/browser/{quote(uri.removeprefix('gs://'))}"
