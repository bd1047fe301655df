"""Cloud Storage JSON API v1: ``buckets.get`` and ``buckets.getIamPolicy`` of the seeded buckets.

Buckets are seeded (:mod:`sandbox.config`), never created through the API: preflight reads them, and exportData
writes into ``gcs/{bucket}`` under the state dir. A missing bucket is 404 "The specified bucket does not exist.";
a caller without ``storage.buckets.get`` / ``storage.buckets.getIamPolicy`` on the bucket's project gets 403.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sandbox import formats
from sandbox.errors import ApiError
from sandbox.http import Call, Reply, Router, reply
from sandbox.iam import require_storage

if TYPE_CHECKING:
    from sandbox.config import Bucket
    from sandbox.context import Sandbox

SERVICE = "storage"
PREFIX = "/storage/v1/b/{bucket}"


def _bucket(sb: Sandbox, call: Call, permission: str) -> Bucket:
    bucket = sb.store.config.buckets.get(call.params["bucket"])
    if bucket is None:
        raise ApiError("NOT_FOUND", "The specified bucket does not exist.", reason="notFound")
    require_storage(sb, bucket.project, permission)
    return bucket


async def get_bucket(sb: Sandbox, call: Call) -> Reply:
    """``buckets.get``."""
    bucket = _bucket(sb, call, "storage.buckets.get")
    created = formats.zulu(bucket.created)
    body: dict[str, Any] = {
        "kind": "storage#bucket",
        "selfLink": f"https://www.googleapis.com/storage/v1/b/{bucket.name}",
        "id": bucket.name,
        "name": bucket.name,
        "projectNumber": formats.project_number(bucket.project),
        "metageneration": "1",
        "location": bucket.location,
        "locationType": "multi-region" if "-" not in bucket.location else "region",
        "storageClass": "STANDARD",
        "etag": "CAE=",
        "timeCreated": created,
        "updated": created,
        "iamConfiguration": {"uniformBucketLevelAccess": {"enabled": True}, "publicAccessPrevention": "enforced"},
    }
    return reply(body)


async def get_bucket_iam_policy(sb: Sandbox, call: Call) -> Reply:
    """``buckets.getIamPolicy``: the bucket's bindings."""
    bucket = _bucket(sb, call, "storage.buckets.getIamPolicy")
    bindings = [{"role": role, "members": list(members)} for role, members in sorted(bucket.bindings.items())]
    return reply(
        {
            "kind": "storage#policy",
            "resourceId": f"projects/_/buckets/{bucket.name}",
            "version": 1,
            "etag": "CAE=",
            "bindings": bindings,
        }
    )


def register(router: Router) -> None:
    """Add the Storage routes."""
    router.add("GET", PREFIX, SERVICE, get_bucket)
    router.add("GET", PREFIX + "/iam", SERVICE, get_bucket_iam_policy)
