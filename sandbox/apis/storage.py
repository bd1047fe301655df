"""Cloud Storage JSON API v1: ``buckets.get`` / ``buckets.getIamPolicy`` of the seeded buckets, and their objects
(insert by multipart or media upload, list, get, delete).

Buckets are seeded (:mod:`sandbox.config`), never created through the API. A missing bucket is 404 "The specified
bucket does not exist." for the bucket and its objects alike; a caller without the bucket's permission on its
project gets 403. Objects are the files under ``gcs/{bucket}/`` in the state dir, the same tree ``exportData`` writes
into, so an exported checkpoint lists here as it would in the bucket. An object's custom ``metadata`` lives beside
the tree (``gcs-meta/{bucket}/{name}.json``); an object ``exportData`` wrote has none, as on Cloud Storage. Object
names may hold ``/``: the object routes match the rest of the path (the server routes the decoded path).
"""

from __future__ import annotations

import base64
import email.parser
import email.policy
import hashlib
import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sandbox import files, formats
from sandbox.errors import ApiError, invalid, not_found
from sandbox.http import Call, Reply, Route, Router, compile_template, reply
from sandbox.iam import require_storage

if TYPE_CHECKING:
    from sandbox.config import Bucket
    from sandbox.context import Sandbox

SERVICE = "storage"
# Bucket names (cloud.google.com/storage/docs/buckets#naming), without the dotted form's 222 characters.
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9._-]{1,61}[a-z0-9]$")
# Custom metadata is limited to 8 KiB in total (cloud.google.com/storage/quotas#objects).
METADATA_MAX = 8 * 1024
LIST_MAX = 1000


PREFIX = "/storage/v1/b/{bucket}"


def _seeded(sb: Sandbox, name: str, permission: str) -> Bucket:
    bucket = sb.store.config.buckets.get(name)
    if bucket is None:
        raise ApiError("NOT_FOUND", "The specified bucket does not exist.", reason="notFound")
    require_storage(sb, bucket.project, permission)
    return bucket


def _bucket(sb: Sandbox, name: str, permission: str) -> Path:
    """The directory of a seeded bucket's objects, once the caller may ``permission`` on it."""
    if not _BUCKET.match(name):
        raise invalid(f"Invalid bucket name: '{name}'")
    _seeded(sb, name, permission)
    return files.gcs_root(sb.state_dir) / name


def _object_path(root: Path, name: str) -> Path:
    if not name or len(name.encode()) > 1024 or "\n" in name or "\r" in name:
        raise invalid("The object name is invalid: 1 to 1024 bytes of UTF-8, no carriage return or line feed.")
    try:
        return files.inside(root, name)
    except files.PathEscapeError as exc:
        raise invalid(f"The object name is invalid: {exc}") from exc


def _meta_path(sb: Sandbox, bucket: str, name: str) -> Path:
    return files.inside(files.gcs_meta_root(sb.state_dir) / bucket, name + ".json")


def _resource(sb: Sandbox, bucket: str, name: str, path: Path) -> dict[str, Any]:
    """The object resource as ``objects.get`` answers it (``projection=noAcl``)."""
    data = path.read_bytes()
    stat = path.stat()
    meta_file = _meta_path(sb, bucket, name)
    metadata = json.loads(meta_file.read_text()) if meta_file.exists() else None
    generation = str(stat.st_mtime_ns // 1000)
    found: dict[str, Any] = {
        "kind": "storage#object",
        "id": f"{bucket}/{name}/{generation}",
        "selfLink": f"https://www.googleapis.com/storage/v1/b/{bucket}/o/{name}",
        "name": name,
        "bucket": bucket,
        "generation": generation,
        "metageneration": "1",
        "contentType": "application/octet-stream" if metadata is None else metadata.get("contentType", ""),
        "size": str(len(data)),
        "md5Hash": base64.b64encode(hashlib.md5(data).digest()).decode(),
        "timeCreated": formats.zulu(stat.st_mtime),
        "updated": formats.zulu(stat.st_mtime),
    }
    if metadata is not None and metadata.get("metadata"):
        found["metadata"] = metadata["metadata"]
    return found


def _multipart(call: Call) -> tuple[dict[str, Any], bytes]:
    """The metadata part and the media part of an ``uploadType=multipart`` body."""
    # The handler sees no headers: the boundary is the body's first line, as the Content-Type names it.
    first = call.text.lstrip("\r\n").split("\n", 1)[0].strip()
    if not first.startswith("--") or len(first) < 3:
        raise invalid("The body of an uploadType=multipart request is not multipart/related.")
    message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
        f'Content-Type: multipart/related; boundary="{first[2:]}"\r\n\r\n'.encode() + call.text.encode()
    )
    parts = list(message.iter_parts()) if message.is_multipart() else []
    if len(parts) != 2:
        raise invalid("A multipart upload has exactly two parts: the metadata, then the media.")
    try:
        metadata = json.loads(parts[0].get_content())
    except (TypeError, ValueError) as exc:
        raise invalid(f"The metadata part is not JSON: {exc}", reason="parseError") from exc
    if not isinstance(metadata, dict):
        raise invalid("The metadata part must be a JSON object.")
    media = parts[1].get_payload(decode=True) or b""
    return metadata, media


async def insert_object(sb: Sandbox, call: Call) -> Reply:
    """``objects.insert`` through the upload URL (``uploadType=multipart``; ``media`` with ``name=``)."""
    bucket = call.params["bucket"]
    root = _bucket(sb, bucket, "storage.objects.create")
    kind = call.arg("uploadType")
    if kind == "multipart":
        metadata, media = _multipart(call)
    elif kind == "media":
        metadata, media = {"name": call.arg("name")}, call.text.encode()
    else:
        raise invalid(f"Upload type {kind!r} is not supported here: use multipart or media.")
    name = str(metadata.get("name") or call.arg("name") or "")
    custom = metadata.get("metadata") or {}
    if not isinstance(custom, dict) or not all(isinstance(v, str) for v in custom.values()):
        raise invalid("metadata: custom metadata is a map of strings to strings.")
    if sum(len(k.encode()) + len(v.encode()) for k, v in custom.items()) > METADATA_MAX:
        raise invalid(f"metadata: custom metadata exceeds {METADATA_MAX} bytes.")
    path = _object_path(root, name)
    if call.arg("ifGenerationMatch") == "0" and path.exists():
        raise ApiError("FAILED_PRECONDITION", "At least one of the pre-conditions you specified did not hold.",
                       reason="conditionNotMet", http=412)  # fmt: skip
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(media)
    meta_file = _meta_path(sb, bucket, name)
    meta_file.parent.mkdir(parents=True, exist_ok=True)
    meta_file.write_text(json.dumps({"metadata": custom, "contentType": str(metadata.get("contentType", ""))}))
    return reply(_resource(sb, bucket, name, path))


async def list_objects(sb: Sandbox, call: Call) -> Reply:
    """``objects.list`` with ``prefix``, ``maxResults`` and ``pageToken`` (names in lexicographic order)."""
    bucket = call.params["bucket"]
    root = _bucket(sb, bucket, "storage.objects.list")
    prefix = call.arg("prefix") or ""
    try:
        size = min(int(call.arg("maxResults") or LIST_MAX), LIST_MAX)
    except ValueError as exc:
        raise invalid(f"Invalid value for maxResults: {call.arg('maxResults')}") from exc
    names = sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()) if root.exists() else []
    names = [n for n in names if n.startswith(prefix)]
    token = call.arg("pageToken")
    if token:
        names = [n for n in names if n > base64.urlsafe_b64decode(token.encode()).decode()]
    body: dict[str, Any] = {"kind": "storage#objects"}
    page = names[:size]
    if page:
        body["items"] = [_resource(sb, bucket, n, root / n) for n in page]
    if len(names) > size:
        body["nextPageToken"] = base64.urlsafe_b64encode(page[-1].encode()).decode()
    return reply(body)


def _existing(sb: Sandbox, call: Call, permission: str) -> tuple[str, str, Path]:
    bucket, name = call.params["bucket"], call.params["object"]
    path = _object_path(_bucket(sb, bucket, permission), name)
    if not path.is_file():
        raise not_found(f"No such object: {bucket}/{name}")
    return bucket, name, path


async def get_object(sb: Sandbox, call: Call) -> Reply:
    """``objects.get`` (the metadata; ``alt=media`` is not served: records live in the metadata)."""
    if call.arg("alt") == "media":
        raise invalid("alt=media downloads are not served by the sandbox.")
    bucket, name, path = _existing(sb, call, "storage.objects.get")
    return reply(_resource(sb, bucket, name, path))


async def delete_object(sb: Sandbox, call: Call) -> Reply:
    """``objects.delete``: 204 with no body; 404 when there is no such object."""
    bucket, name, path = _existing(sb, call, "storage.objects.delete")
    path.unlink()
    _meta_path(sb, bucket, name).unlink(missing_ok=True)
    return reply(None, 204)


async def get_bucket(sb: Sandbox, call: Call) -> Reply:
    """``buckets.get``."""
    bucket = _seeded(sb, call.params["bucket"], "storage.buckets.get")
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
    bucket = _seeded(sb, call.params["bucket"], "storage.buckets.getIamPolicy")
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


def _object_route(method: str, handler: Any) -> Route:
    # {object} is the rest of the path: object names hold '/' (percent-encoded on the wire, decoded here).
    template = "/storage/v1/b/{bucket}/o/{object}"
    pattern = re.compile(compile_template("/storage/v1/b/{bucket}/o/").pattern.rstrip("$") + "(?P<object>.+)$")
    return Route(method, template, SERVICE, handler, pattern)


def register(router: Router) -> None:
    """Add the Cloud Storage bucket and object routes."""
    router.add("GET", PREFIX, SERVICE, get_bucket)
    router.add("GET", PREFIX + "/iam", SERVICE, get_bucket_iam_policy)
    router.add("POST", "/upload/storage/v1/b/{bucket}/o", SERVICE, insert_object)
    router.add("GET", "/storage/v1/b/{bucket}/o", SERVICE, list_objects)
    router.routes.append(_object_route("GET", get_object))
    router.routes.append(_object_route("DELETE", delete_object))
