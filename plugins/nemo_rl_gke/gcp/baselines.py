"""The base model's evaluation score, measured once and remembered: one Cloud Storage object per release, base model,
benchmark and sampling settings (:func:`nemo_rl_gke.plan.model_out.baseline_key`), in the run's export bucket.

The score lives in the object's custom metadata, as the checkpoint records do (:mod:`nemo_rl_gke.gcp.pending`): one
``objects.insert`` writes it, one ``objects.get`` reads it back, and no download is needed. Any run of any DAG with the
same key reuses it, so a nightly schedule evaluates the base model on its first night only.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from nemo_rl_gke.gcp.hooks import is_not_found
from nemo_rl_gke.gcp.pending import execute

if TYPE_CHECKING:
    from nemo_rl_gke.gcp.hooks import GcpHook
    from nemo_rl_gke.run.spec import RunSpec

BASELINES_PATH = "nemo-rl-gke/baselines"


class Baselines:
    """The remembered base-model scores in one run's export bucket."""

    def __init__(self, hook: GcpHook, spec: RunSpec) -> None:
        self.hook = hook
        self.bucket = spec.export_bucket_name

    @staticmethod
    def name(key: Mapping[str, Any]) -> str:
        """The object of one key: a digest of its canonical JSON."""
        digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]
        return f"{BASELINES_PATH}/{digest}.json"

    def uri(self, key: Mapping[str, Any]) -> str:
        """``gs://`` of one key's object."""
        return f"gs://{self.bucket}/{self.name(key)}"

    def get(self, key: Mapping[str, Any]) -> dict[str, Any] | None:
        """The remembered result for ``key`` (None: never measured, or measured for another key)."""
        request = self.hook.storage.objects().get(bucket=self.bucket, object=self.name(key))
        try:
            found = execute(self.hook, request, f"read the base model's score {self.uri(key)}")
        except Exception as exc:
            if is_not_found(exc):
                return None
            raise
        metadata = found.get("metadata") or {}
        try:
            stored_key, result = json.loads(metadata["key"]), json.loads(metadata["result"])
        except (KeyError, TypeError, ValueError):
            return None
        return {**result, "measured_by": metadata.get("measured_by")} if stored_key == dict(key) else None

    def put(self, key: Mapping[str, Any], result: Mapping[str, Any], run: str) -> str:
        """Remember ``result`` (an EvalResult's dict) for ``key``, measured by ``run``; returns its ``gs://``."""
        from googleapiclient.http import MediaInMemoryUpload

        metadata = {"key": json.dumps(key, sort_keys=True), "result": json.dumps(result), "measured_by": run}
        body = json.dumps({**metadata, "key": dict(key), "result": dict(result)}, indent=1).encode()
        request = self.hook.storage.objects().insert(
            bucket=self.bucket,
            body={"name": self.name(key), "contentType": "application/json", "metadata": metadata},
            media_body=MediaInMemoryUpload(body, mimetype="application/json"),
        )
        execute(self.hook, request, f"write the base model's score {self.uri(key)}")
        return self.uri(key)
