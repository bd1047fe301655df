"""The process's Google credentials: built once per connection, not once per hook.

GoogleBaseHook caches credentials on the hook instance, and every task, trigger and lease write makes a new hook.
Building service-account credentials parses and checks the RSA private key, about 60 ms of CPU each time here. In the
triggerer that CPU is taken from the process whose event loop every trigger shares, and in a run of fifty tasks it
is seconds. Sharing one credentials object also shares its access token until google-auth refreshes it near its
expiry (a refresh racing another in a second thread only fetches one token more).

The cache key is a digest of everything the provider builds credentials from (the connection's extras, the key
file's identity, scopes, impersonation, quota project), so a rotated key or an edited connection builds anew. The
key material itself is never kept outside the credentials object.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

# Distinct connections per process are few; the bound only stops an ever-edited connection from growing the cache.
MAX_ENTRIES = 16

_cache: OrderedDict[str, tuple[Any, str | None]] = OrderedDict()
_lock = threading.Lock()


def cache_key(hook: Any) -> str:
    """A digest of what ``hook`` (a GoogleBaseHook) would build its credentials from."""
    extras = getattr(hook, "extras", {}) or {}
    key_path = extras.get("key_path") or extras.get("extra__google_cloud_platform__key_path")
    key_file: tuple[str, int, int] | None = None
    if key_path:
        try:
            stat = os.stat(key_path)
            key_file = (str(key_path), stat.st_mtime_ns, stat.st_size)
        except OSError:
            key_file = (str(key_path), -1, -1)  # the provider raises its own error when it reads it
    material = {
        "conn_id": getattr(hook, "gcp_conn_id", None),
        "extras": extras,
        "key_file": key_file,
        "scopes": list(getattr(hook, "scopes", None) or []),
        "impersonation_chain": getattr(hook, "impersonation_chain", None),
        "quota_project_id": getattr(hook, "quota_project_id", None),
    }
    return hashlib.sha256(json.dumps(material, sort_keys=True, default=str).encode()).hexdigest()


def shared_credentials(hook: Any, build: Callable[[], tuple[Any, str | None]]) -> tuple[Any, str | None]:
    """``build()``'s credentials and project for ``hook``'s connection, built at most once per process per key.

    A failed build is not cached: the next hook tries again (and raises the provider's error again).
    """
    key = cache_key(hook)
    with _lock:
        if key in _cache:
            _cache.move_to_end(key)
            return _cache[key]
    built = build()
    with _lock:
        _cache[key] = built
        while len(_cache) > MAX_ENTRIES:
            _cache.popitem(last=False)
    return built


def clear() -> None:
    """Forget every shared credentials object (tests that need a fresh token fetch)."""
    with _lock:
        _cache.clear()
