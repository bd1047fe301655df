"""The non-apply PATCH kinds of the Kubernetes API, as kube-apiserver v1.32 applies them to a stored object.

- JSON patch (``application/json-patch+json``, RFC 6902) as ``gopkg.in/evanphx/json-patch.v4`` v4.12.0 applies it
  (the version k8s.io/apiserver v0.32 pins): ``add``/``remove``/``replace``/``move``/``copy``/``test``, negative
  indices, and v4's quirks (``replace`` of a missing object key sets it, ``test`` of a missing key against ``null``
  passes). A failing operation is answered the way ``handlers/patch.go`` answers it: 422 with the generic
  ``NewGenericServerResponse`` message, the operation's own error is not sent.
- JSON merge patch (``application/merge-patch+json``, RFC 7386) as ``jsonpatch.MergePatch``.
- Strategic merge patch (``application/strategic-merge-patch+json``) as ``k8s.io/apimachinery/pkg/util/strategicpatch``
  merges it for a built-in kind: lists merged by their ``patchMergeKey`` (the tags of ``k8s.io/api`` v0.32
  ``types.go``, :data:`POD_SPEC_LISTS` and friends), ``$patch: replace|delete|merge``, ``$retainKeys``,
  ``$setElementOrder/<list>`` and ``$deleteFromPrimitiveList/<list>`` directives. Custom resources refuse it with
  415, as the CRD handler does (its patch types leave strategic merge out).

The list schema (which lists are associative and by which keys, which are sets) is shared with
:mod:`sandbox.kube_fields`, which keeps managedFields in structured-merge-diff's terms.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from typing import Any

from sandbox.kube_errors import KubeError

JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"
# The patch types in the order the API server lists them in its 415 message: the built-in kinds' (apiserver
# pkg/endpoints/installer.go:892) and the custom resources' (apiextensions-apiserver customresource_handler.go:325).
BUILTIN_PATCH_TYPES = (JSON_PATCH, MERGE_PATCH, STRATEGIC_PATCH, APPLY_PATCH)
CUSTOM_PATCH_TYPES = (JSON_PATCH, MERGE_PATCH, APPLY_PATCH)
# Groups whose kinds are compiled into kube-apiserver (strategic merge works); everything else is a CRD.
BUILTIN_GROUPS = frozenset({"", "apps", "batch", "policy", "rbac.authorization.k8s.io", "storage.k8s.io"})
# The generic message NewGenericServerResponse gives a 422 (apimachinery pkg/api/errors/errors.go:477); a failed JSON
# patch operation is answered with it (apiserver handlers/patch.go:414), the operation's error is not sent.
INVALID_REQUEST = "the server rejected our request due to an error in our request"


class PatchError(KubeError):
    """A patch the API server refuses: its HTTP code, Status reason and message."""

    def __init__(self, code: int, reason: str, message: str, detail: str = "") -> None:
        super().__init__(code, reason, message)
        # What the patch library itself said (json-patch's error): the API server does not send it either.
        self.detail = detail


@dataclass(frozen=True)
class ListType:
    """How a list field merges: ``atomic`` (replaced whole), ``map`` (items keyed by ``keys``; strategic merge keys
    them by ``merge_key``) or ``set`` (scalars, merged as a set); ``strategy`` is the patchStrategy tag."""

    relationship: str = "atomic"
    keys: tuple[str, ...] = ()
    merge_key: str = ""
    strategy: str = ""

    @property
    def merges(self) -> bool:
        """Whether strategic merge merges this list (patchStrategy merge) instead of replacing it."""
        return "merge" in self.strategy.split(",")


ATOMIC = ListType()


def _keyed(*keys: str, strategy: str = "merge") -> ListType:
    return ListType("map", keys, keys[0], strategy)


# Container's lists (k8s.io/api core/v1/types.go v0.32: Ports 2801-2806, Env 2819-2823, VolumeMounts 2855-2859,
# VolumeDevices 2861-2866; EphemeralContainerCommon repeats them at 4692-4745). Ports are keyed by containerPort and
# protocol for structured merge (+listMapKey) but by containerPort alone for strategic merge (patchMergeKey).
_CONTAINER_LISTS: dict[tuple[str, ...], ListType] = {
    ("ports",): _keyed("containerPort", "protocol"),
    ("env",): _keyed("name"),
    ("volumeMounts",): _keyed("mountPath"),
    ("volumeDevices",): _keyed("devicePath"),
}
# PodSpec's lists (core/v1/types.go v0.32: Volumes 3782-3786 merge,retainKeys; InitContainers 3800-3804; Containers
# 3809-3813; EphemeralContainers 3819-3823; ImagePullSecrets 3912-3916; HostAliases 3939-3943;
# TopologySpreadConstraints 4001-4006; SchedulingGates 4067-4072; ResourceClaims 4083-4089). Tolerations, args and
# command carry no tag: atomic.
POD_SPEC_LISTS: dict[tuple[str, ...], ListType] = {
    ("volumes",): _keyed("name", strategy="merge,retainKeys"),
    ("imagePullSecrets",): _keyed("name"),
    ("hostAliases",): _keyed("ip"),
    ("topologySpreadConstraints",): _keyed("topologyKey", "whenUnsatisfiable"),
    ("schedulingGates",): _keyed("name"),
    ("resourceClaims",): _keyed("name", strategy="merge,retainKeys"),
    **{
        (containers, *sub): list_type
        for containers in ("containers", "initContainers", "ephemeralContainers")
        for sub, list_type in {(): _keyed("name"), **_CONTAINER_LISTS}.items()
    },
}
# ObjectMeta's lists (apimachinery pkg/apis/meta/v1/types.go v0.32: OwnerReferences 236-241, Finalizers 256-259),
# the same for every kind, custom resources included.
META_LISTS: dict[tuple[str, ...], ListType] = {
    ("metadata", "ownerReferences"): _keyed("uid"),
    ("metadata", "finalizers"): ListType("set", strategy="merge"),
}
# Where a PodSpec sits in each built-in kind the sandbox serves.
POD_SPEC_AT: dict[str, tuple[str, ...]] = {
    "Pod": ("spec",),
    "PodTemplate": ("template", "spec"),
    "DaemonSet": ("spec", "template", "spec"),
}
# ServiceSpec.Ports (core/v1/types.go v0.32:5456-5461): patchMergeKey port, listMapKey port and protocol.
OTHER_LISTS: dict[str, dict[tuple[str, ...], ListType]] = {"Service": {("spec", "ports"): _keyed("port", "protocol")}}
# Key fields the API server defaults before it keys an item (ContainerPort and ServicePort protocol default TCP), so
# an item applied without them gets the same key as the stored one.
KEY_DEFAULTS = {"protocol": "TCP"}


def is_builtin(group_version: str) -> bool:
    """Whether ``group_version`` is served by kube-apiserver itself rather than by a CRD."""
    return group_version.rpartition("/")[0] in BUILTIN_GROUPS


def list_type(group_version: str, kind: str, path: tuple[str, ...]) -> ListType:
    """How the list at ``path`` (field names only, list items skipped) of a ``kind`` merges. Lists of custom
    resources are atomic, as a CRD's arrays are without ``x-kubernetes-list-type``; so are untagged built-in lists."""
    if path in META_LISTS:
        return META_LISTS[path]
    if not is_builtin(group_version):
        return ATOMIC
    root = POD_SPEC_AT.get(kind)
    if root is not None and path[: len(root)] == root and path[len(root) :] in POD_SPEC_LISTS:
        return POD_SPEC_LISTS[path[len(root) :]]
    return OTHER_LISTS.get(kind, {}).get(path, ATOMIC)


def patch_types(group_version: str) -> tuple[str, ...]:
    """The PATCH content types the API server accepts for this groupVersion."""
    return BUILTIN_PATCH_TYPES if is_builtin(group_version) else CUSTOM_PATCH_TYPES


def check_content_type(content_type: str, group_version: str) -> str:
    """The patch type of a request's Content-Type (parameters dropped, as patch.go:78-82 does), or 415 with the
    negotiation error's message (apiserver handlers/negotiation/errors.go:88-90) when this resource does not take
    it: a custom resource refuses strategic merge this way."""
    media = content_type.split(";", 1)[0].strip()
    accepted = patch_types(group_version)
    if media not in accepted:
        raise PatchError(
            415,
            "UnsupportedMediaType",
            "the body of the request was in an unknown format - accepted media types include: " + ", ".join(accepted),
        )
    return media


def apply_patch(patch_type: str, current: dict[str, Any], text: str, group_version: str, kind: str) -> dict[str, Any]:
    """``current`` (left untouched) with a JSON, merge or strategic merge patch applied; PatchError as the API server
    answers a patch it cannot decode (400) or apply (422)."""
    try:
        patch = json.loads(text) if text.strip() else None
    except ValueError as exc:
        if patch_type == MERGE_PATCH:
            # jsonpatch.MergePatch answers a syntax error with ErrBadJSONPatch (merge.go:123-125, patch.go:428-430).
            raise PatchError(400, "BadRequest", "Invalid JSON Patch") from exc
        raise PatchError(400, "BadRequest", f"invalid character in the patch body: {exc}") from exc
    if patch_type == JSON_PATCH:
        return json_patch(current, patch)
    if patch_type == MERGE_PATCH:
        if patch is None:
            raise PatchError(400, "BadRequest", "Invalid JSON Patch")  # merge.go:131-133: a null patch
        return merge_patch(current, patch)
    if patch_type == STRATEGIC_PATCH:
        if not isinstance(patch, dict):
            raise PatchError(400, "BadRequest", "invalid JSON document")  # mergepatch.ErrBadJSONDoc
        return strategic_merge_patch(current, patch, group_version, kind)
    raise PatchError(415, "UnsupportedMediaType", f"unknown Content-Type header for patch: {patch_type}")


# --- JSON patch (RFC 6902, evanphx/json-patch v4) ------------------------------------------------------------------
_MISSING = object()


class _OpError(Exception):
    """One JSON patch operation failed; the text is json-patch's own error."""


def json_patch(doc: dict[str, Any], operations: Any) -> dict[str, Any]:
    """RFC 6902 applied as json-patch v4 applies it. A body that is not a list of operations is a 400 (DecodePatch,
    patch.go:403-406); an operation that fails is a 422 with the generic message (patch.go:412-415)."""
    if not isinstance(operations, list) or not all(isinstance(op, dict) for op in operations):
        what = "object" if isinstance(operations, dict) else type(operations).__name__
        raise PatchError(400, "BadRequest", f"json: cannot unmarshal {what} into Go value of type jsonpatch.Patch")
    if len(operations) > 10000:  # maxJSONPatchOperations, patch.go:63
        raise PatchError(
            413,
            "RequestEntityTooLarge",
            f"The allowed maximum operations in a JSON patch is 10000, got {len(operations)}",
        )
    root: list[Any] = [copy.deepcopy(doc)]
    try:
        for op in operations:
            _json_op(root, op)
    except _OpError as exc:
        raise PatchError(422, "Invalid", INVALID_REQUEST, detail=str(exc)) from exc
    if not isinstance(root[0], dict):
        raise PatchError(422, "Invalid", INVALID_REQUEST, detail="the patched document is not an object")
    return root[0]


def _unescape(token: str) -> str:
    return token.replace("~1", "/").replace("~0", "~")


def _find(root: list[Any], path: str) -> tuple[Any, str] | None:
    """The container that holds the last token of ``path``, and that token (json-patch's findObject): None when
    the path has no parent in the document."""
    parts = path.split("/")
    if len(parts) < 2:
        return None
    node = root[0]
    for part in parts[1:-1]:
        try:
            node = _get(node, _unescape(part))
        except _OpError:
            return None
        if not isinstance(node, (dict, list)):
            return None
    return node, _unescape(parts[-1])


def _index(container: list[Any], key: str, size: int) -> int:
    try:
        idx = int(key)
    except ValueError:
        raise _OpError(f'strconv.Atoi: parsing "{key}": invalid syntax') from None
    if idx < 0:
        if idx < -size:
            raise _OpError(f"Unable to access invalid index: {idx}: invalid index referenced")
        idx += size
    return idx


def _get(container: Any, key: str) -> Any:
    if isinstance(container, dict):
        value = container.get(key)
        return _MISSING if value is None else value  # v4 cannot tell a null member from a missing one
    idx = _index(container, key, len(container))
    if idx >= len(container):
        raise _OpError(f"Unable to access invalid index: {idx}: invalid index referenced")
    return container[idx]


def _add(container: Any, key: str, value: Any) -> None:
    if isinstance(container, dict):
        container[key] = value
        return
    if key == "-":
        container.append(value)
        return
    try:
        int(key)
    except ValueError:
        raise _OpError(f"value was not a proper array index: '{key}': strconv.Atoi: parsing \"{key}\"") from None
    idx = _index(container, key, len(container) + 1)
    if idx > len(container):
        raise _OpError(f"Unable to access invalid index: {idx}: invalid index referenced")
    container.insert(idx, value)


def _remove(container: Any, key: str) -> Any:
    if isinstance(container, dict):
        if key not in container:
            raise _OpError(f"Unable to remove nonexistent key: {key}: missing value")
        return container.pop(key)
    idx = _index(container, key, len(container))
    if idx >= len(container):
        raise _OpError(f"Unable to access invalid index: {idx}: invalid index referenced")
    return container.pop(idx)


def _json_op(root: list[Any], op: dict[str, Any]) -> None:
    """One operation (json-patch v4 Patch.ApplyIndent's switch, patch.go:809-830)."""
    kind = op.get("op")
    path = op.get("path")
    if not isinstance(path, str):
        raise _OpError(f"{kind} operation failed to decode path: operation missing path field: missing value")
    value = copy.deepcopy(op.get("value"))  # v4 takes a missing value as null
    if kind not in {"add", "remove", "replace", "move", "copy", "test"}:
        raise _OpError(f"Unexpected kind: {kind}")
    if kind in {"replace", "test"} and path == "":
        if kind == "replace":
            root[0] = value
        elif root[0] != value:
            raise _OpError("testing value  failed: test failed")
        return
    if kind in {"move", "copy"}:
        value = _source(root, op, kind)
    found = _find(root, path)
    if found is None:
        where = {"test": "is missing path", "move": "doc is missing destination path"}.get(kind, "doc is missing path")
        where = "doc is missing destination path" if kind == "copy" else where
        shown = f'"{path}"' if kind in {"add", "remove"} else path
        raise _OpError(f"{kind} operation does not apply: {where}: {shown}: missing value")
    _operate(*found, kind, path, value)


def _source(root: list[Any], op: dict[str, Any], kind: str) -> Any:
    """The value a move takes away or a copy duplicates."""
    source = op.get("from")
    if not isinstance(source, str):
        raise _OpError(f"{kind} operation failed to decode from: operation, missing from field: missing value")
    found = _find(root, source)
    if found is None:
        raise _OpError(f"{kind} operation does not apply: doc is missing from path: {source}: missing value")
    container, key = found
    if kind == "move":
        return _remove(container, key)
    value = copy.deepcopy(_get(container, key))
    return None if value is _MISSING else value


def _operate(container: Any, key: str, kind: str, path: str, value: Any) -> None:
    if kind in {"add", "move", "copy"}:
        _add(container, key, value)
    elif kind == "remove":
        try:
            _remove(container, key)
        except _OpError as exc:
            raise _OpError(f"error in remove for path: '{path}': {exc}") from None
    elif kind == "replace":
        try:
            _get(container, key)
        except _OpError:
            raise _OpError(f"replace operation does not apply: doc is missing key: {path}: missing value") from None
        if isinstance(container, dict):
            container[key] = value  # v4: a missing object member is set, not refused
        else:
            container[_index(container, key, len(container))] = value
    else:
        current = _get(container, key)
        if (None if current is _MISSING else current) != value:
            raise _OpError(f"testing value {path} failed: test failed")


# --- JSON merge patch (RFC 7386) -----------------------------------------------------------------------------------
def merge_patch(doc: Any, patch: Any) -> Any:
    """RFC 7386: maps merge key by key, ``null`` deletes, anything else (lists included) replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(doc) if isinstance(doc, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


# --- strategic merge patch (apimachinery pkg/util/strategicpatch) ------------------------------------------------
DIRECTIVE = "$patch"
RETAIN_KEYS = "$retainKeys"
SET_ORDER = "$setElementOrder/"
DELETE_FROM = "$deleteFromPrimitiveList/"


@dataclass(frozen=True)
class _Schema:
    """Where a strategic merge is in an object: its kind and the field path (list items skipped)."""

    group_version: str
    kind: str
    path: tuple[str, ...] = ()

    def child(self, key: str) -> _Schema:
        return _Schema(self.group_version, self.kind, (*self.path, key))

    def list_type(self, key: str) -> ListType:
        return list_type(self.group_version, self.kind, (*self.path, key))


def strategic_merge_patch(doc: dict[str, Any], patch: dict[str, Any], group_version: str, kind: str) -> dict[str, Any]:
    """A strategic merge patch applied to ``doc`` as the API server applies it (MergeParallelList and
    IgnoreUnmatchedNulls on). Refused (415) for a custom resource, whose handler does not take it."""
    check_content_type(STRATEGIC_PATCH, group_version)
    return _merge_map(copy.deepcopy(doc), copy.deepcopy(patch), _Schema(group_version, kind))


def _directive_map(value: Any, patch: dict[str, Any]) -> dict[str, Any]:
    """``$patch`` in a map (strategicpatch handleDirectiveInMergeMap): replace takes the patch, delete empties it."""
    if value == "replace":
        return {k: v for k, v in patch.items() if k != DIRECTIVE}
    if value == "delete":
        return {}
    raise PatchError(400, "BadRequest", f"unknown patch type: {value} in map: {_go_map(patch)}")


def _go_map(value: Any) -> str:
    """A value as Go's %v prints a map[string]interface{} (sorted keys), for error messages."""
    if isinstance(value, dict):
        return "map[" + " ".join(f"{k}:{_go_map(v)}" for k, v in sorted(value.items())) + "]"
    if isinstance(value, list):
        return "[" + " ".join(_go_map(v) for v in value) + "]"
    return "<nil>" if value is None else str(value)


def _strip(value: Any) -> tuple[Any, bool]:
    """A new value without directives and nulls (removeDirectives + discardNullValuesFromPatch); False when the
    value is only a directive."""
    if isinstance(value, dict):
        if DIRECTIVE in value and len(value) == 1:
            return None, False
        out = {}
        for k, v in value.items():
            if k in {DIRECTIVE, RETAIN_KEYS} or k.startswith((SET_ORDER, DELETE_FROM)) or v is None:
                continue
            stripped, keep = _strip(v)
            if keep:
                out[k] = stripped
        return out, True
    if isinstance(value, list):
        items = [_strip(v) for v in value]
        return [v for v, keep in items if keep], True
    return value, True


def _merge_map(original: dict[str, Any], patch: dict[str, Any], schema: _Schema) -> dict[str, Any]:  # noqa: C901
    if DIRECTIVE in patch:
        return _directive_map(patch[DIRECTIVE], patch)
    retain = patch.pop(RETAIN_KEYS, None)
    if retain is not None:
        if not isinstance(retain, list):
            raise PatchError(400, "BadRequest", "invalid patch format of retainKeys")
        for key in list(original):
            if key not in retain:
                del original[key]
    orders = {k[len(SET_ORDER) :]: patch.pop(k) for k in list(patch) if k.startswith(SET_ORDER)}
    # The live order of each reordered list, before the patch merges into it (mergeSortedSlice's serverOrder).
    live = {k: list(original[k]) for k in orders if isinstance(original.get(k), list)}
    for key, value in patch.items():
        if key.startswith(DELETE_FROM):
            field = key[len(DELETE_FROM) :]
            if not isinstance(value, list):
                raise PatchError(400, "BadRequest", "invalid patch format of primitive list")
            if isinstance(original.get(field), list):
                original[field] = [item for item in original[field] if item not in value]
            continue
        if value is None:
            original.pop(key, None)
            continue
        current = original.get(key)
        if current is None or type(current) is not type(value):
            stripped, keep = _strip(value)
            if keep:
                original[key] = stripped
            else:
                original.pop(key, None)
        elif isinstance(value, dict):
            original[key] = _merge_map(current, value, schema.child(key))
        elif isinstance(value, list):
            original[key] = _merge_list(current, value, schema, key)
        else:
            original[key] = value
    for key, order in orders.items():
        if not isinstance(order, list):
            raise PatchError(400, "BadRequest", "invalid patch format of setElementOrder list")
        if isinstance(original.get(key), list):
            original[key] = _order(original[key], order, schema.list_type(key).merge_key, live.get(key, []))
    return original


def _merge_list(original: list[Any], patch: list[Any], schema: _Schema, key: str) -> list[Any]:
    """One list field: replaced unless its patchStrategy is merge; then scalars are unioned and maps are merged
    item by item on the patchMergeKey (strategicpatch mergeSlice)."""
    shape = schema.list_type(key)
    if not shape.merges:
        return _strip(patch)[0]
    if any(isinstance(item, list) for item in patch):
        raise PatchError(422, "Invalid", INVALID_REQUEST, detail="lists of lists are not supported")
    if not any(isinstance(item, dict) for item in patch):
        return original + [item for item in patch if item not in original]
    if any(isinstance(item, dict) and item.get(DIRECTIVE) == "replace" for item in patch):
        return [_strip(item)[0] for item in patch if not (isinstance(item, dict) and DIRECTIVE in item)]
    merged = list(original)
    for item in patch:
        if not isinstance(item, dict) or shape.merge_key not in item:
            raise PatchError(
                400, "BadRequest", f"map: {_go_map(item)} does not contain declared merge key: {shape.merge_key}"
            )
        same = [isinstance(o, dict) and o.get(shape.merge_key) == item[shape.merge_key] for o in merged]
        at = same.index(True) if True in same else None
        if item.get(DIRECTIVE) == "delete":
            merged = [o for o, hit in zip(merged, same, strict=True) if not hit]
        elif at is None:
            merged.append(_strip(item)[0])
        else:
            merged[at] = _merge_map(merged[at], dict(item), schema.child(key))
    return merged


def _order(merged: list[Any], order: list[Any], merge_key: str, server: list[Any]) -> list[Any]:
    """``$setElementOrder``: the items the order names in its order, the server-only items put back among them by
    their place in the live list (strategicpatch normalizeElementOrder + mergeSortedSlice, patch.go:404-467)."""

    def ident(item: Any) -> Any:
        return item.get(merge_key) if merge_key and isinstance(item, dict) else item

    wanted = [ident(o) for o in order]
    patch_items = sorted(
        (m for m in merged if ident(m) in wanted), key=lambda m: wanted.index(ident(m))
    )  # normalizeSliceOrder
    server_only = [m for m in merged if ident(m) not in wanted]
    live = [ident(m) for m in server]

    def before(left: Any, right: Any) -> bool:
        # Only when both are in the live list is one "less" than the other; otherwise the patch item goes first.
        a, b = ident(left), ident(right)
        return a in live and b in live and live.index(a) < live.index(b)

    left, right, out = server_only, patch_items, []
    i = j = 0
    while i < len(left) or j < len(right):
        if i >= len(left):
            out.append(right[j])
            j += 1
        elif j >= len(right) or before(left[i], right[j]):
            out.append(left[i])
            i += 1
        else:
            out.append(right[j])
            j += 1
    return out
