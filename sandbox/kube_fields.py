"""managedFields as kube-apiserver v1.32 keeps them: structured-merge-diff v4.4.2 field sets, owners and conflicts.

An object's fields are a set of paths. A path element is written as in ``fieldsV1``: ``f:<name>`` for a map field,
``k:{"name":"x"}`` for an item of an associative list (keyed by its list-map keys, see
:func:`sandbox.kube_patch.list_type`), ``v:<json>`` for an item of a set list, ``i:<n>`` for an index. Each owner
(``manager`` and ``operation``, and ``apiVersion`` for an Update) owns a set:

- an Update (create, patch) adds the fields it changed to its manager's set and takes them from every other owner
  (structured-merge-diff merge/update.go:65-174; apimachinery managedfields/internal/managedfieldsupdater.go:44-66);
- an Apply sets its manager's set to the applied configuration's fields, merges the configuration into the object,
  removes the fields the manager applied before, leaves out now and nobody else owns (update.go:176-241), and
  conflicts with any other owner of a field it changes (update.go:65-140) unless forced, when it takes the field;
  applying the value another manager set makes both owners;
- fields nobody can own (apiVersion, kind, metadata.name/namespace/uid/... , status) are stripped
  (managedfields/internal/stripmeta.go:38-52), and an owner left with nothing is dropped.
"""

from __future__ import annotations

import copy
import json
import time
import unicodedata
from dataclasses import dataclass, field
from typing import Any

from sandbox import formats
from sandbox.kube_patch import KEY_DEFAULTS, ListType, is_builtin, list_type

Path = tuple[str, ...]
APPLY = "Apply"
UPDATE = "Update"
FIELDS_V1 = "FieldsV1"
# validation.FieldManagerMaxLength (apimachinery pkg/apis/meta/v1/validation/validation.go:209).
FIELD_MANAGER_MAX = 128
# The owner the API server gives the fields of an object nobody tracked before its first apply
# (managedfields/internal/skipnonapplied.go:47).
BEFORE_FIRST_APPLY = "before-first-apply"
# Paths no manager owns (stripmeta.go:40-51); status is reset on the main resource by every kind's strategy.
STRIPPED: frozenset[Path] = frozenset(
    {
        ("f:apiVersion",),
        ("f:kind",),
        ("f:metadata",),
        *(
            ("f:metadata", f"f:{name}")
            for name in (
                "name",
                "namespace",
                "creationTimestamp",
                "selfLink",
                "uid",
                "clusterName",
                "generation",
                "managedFields",
                "resourceVersion",
            )
        ),
    }
)
STRIPPED_UNDER: frozenset[Path] = frozenset({("f:status",), ("f:metadata", "f:deletionTimestamp")})
# What ``objectCreater.New(gvk)`` gives for a built-in kind, as an unstructured map: the struct fields that are
# never absent (a typed Go object has its non-pointer structs and nil lists). An Update from it (a create) does not
# "add" them, so they get no ``.`` entry; a custom resource's empty object has none of them.
_POD_SPEC = {"containers": None}
EMPTY_BUILTIN: dict[str, dict[str, Any]] = {
    "Pod": {"spec": _POD_SPEC},
    "PodTemplate": {"template": {"metadata": {}, "spec": _POD_SPEC}},
    "DaemonSet": {"spec": {"template": {"metadata": {}, "spec": _POD_SPEC}, "updateStrategy": {}}},
    "Service": {"spec": {}},
    "PersistentVolume": {"spec": {}},
    "PersistentVolumeClaim": {"spec": {}},
    "Namespace": {"spec": {}},
}
_MISSING: Any = object()


class ApplyConflict(Exception):
    """A server-side apply that would change fields other managers own; ``conflicts`` maps their owner to them."""

    def __init__(self, conflicts: dict[Owner, set[Path]]) -> None:
        self.conflicts = conflicts
        super().__init__(self.message())

    def items(self) -> list[tuple[Owner, Path]]:
        """(owner, path) pairs, owners by their identifier (as getConflictMessage sorts them), paths in set order."""
        owners = sorted(self.conflicts, key=lambda o: o.identifier())
        return [(o, p) for o in owners for p in sorted(self.conflicts[o], key=_path_order)]

    def message(self) -> str:
        """The Status message (apimachinery managedfields/internal/conflict.go:46-74)."""
        items = self.items()
        if len(items) == 1:
            owner, path = items[0]
            return f"Apply failed with 1 conflict: conflict with {owner.printed()}: {path_string(path)}"
        lines: list[str] = []
        for owner in sorted(self.conflicts, key=lambda o: o.identifier()):
            lines.append(f"conflicts with {owner.printed()}:")
            lines.extend(f"- {path_string(p)}" for p in sorted(self.conflicts[owner], key=_path_order))
        return f"Apply failed with {len(items)} conflicts: " + "\n".join(lines)

    def causes(self) -> list[dict[str, str]]:
        """Status details.causes, one per field (conflict.go:34-42)."""
        return [
            {"reason": "FieldManagerConflict", "message": f"conflict with {owner.printed()}", "field": path_string(p)}
            for owner, p in self.items()
        ]


@dataclass(frozen=True)
class Owner:
    """Who owns a field set: the manager identity structured-merge-diff keys owners by (BuildManagerIdentifier,
    managedfields.go:134-159: an applier's identity has no apiVersion)."""

    manager: str
    operation: str
    api_version: str = ""

    def identifier(self) -> str:
        """The identifier as the API server builds it (its JSON, which is also what conflicts are sorted by)."""
        ident: dict[str, str] = {"manager": self.manager, "operation": self.operation}
        if self.api_version:
            ident["apiVersion"] = self.api_version
        return json.dumps(ident, separators=(",", ":"))

    def printed(self) -> str:
        """How a conflict names the owner (printManager, conflict.go:76-91): quoted, ``using <apiVersion>`` for an
        Update (the identifier has no time, so no ``at``)."""
        name = json.dumps(self.manager)
        return f"{name} using {self.api_version}" if self.operation == UPDATE else name


@dataclass
class Owned:
    """One owner's fields, the apiVersion it last wrote them in, and when."""

    fields: set[Path]
    api_version: str
    time: str = ""


@dataclass
class Managed:
    """An object's owners, decoded from and encoded back to ``metadata.managedFields``."""

    owners: dict[Owner, Owned] = field(default_factory=dict)

    @classmethod
    def decode(cls, entries: Any) -> Managed:
        """From ``metadata.managedFields``; entries without a FieldsV1 set (written by older sandboxes) are dropped."""
        owners: dict[Owner, Owned] = {}
        for entry in entries if isinstance(entries, list) else []:
            if not isinstance(entry, dict) or not isinstance(entry.get("fieldsV1"), dict):
                continue
            operation = entry.get("operation", UPDATE)
            version = str(entry.get("apiVersion", ""))
            owner = Owner(str(entry.get("manager", "")), operation, version if operation == UPDATE else "")
            owners[owner] = Owned(from_fields_v1(entry["fieldsV1"]), version, str(entry.get("time", "")))
        return cls(owners)

    def encode(self) -> list[dict[str, Any]]:
        """``metadata.managedFields``, sorted as sortEncodedManagedFields sorts them (managedfields.go:194-224):
        Apply before Update, then by time, manager and apiVersion."""
        entries = [
            {
                "manager": owner.manager,
                "operation": owner.operation,
                "apiVersion": owned.api_version,
                **({"time": owned.time} if owned.time else {}),
                "fieldsType": FIELDS_V1,
                "fieldsV1": to_fields_v1(owned.fields),
            }
            for owner, owned in self.owners.items()
            if owned.fields
        ]
        return sorted(entries, key=lambda e: (e["operation"], e.get("time", ""), e["manager"], e["apiVersion"]))


def now_rfc3339() -> str:
    """metav1.Time as it serializes: RFC 3339, whole seconds, UTC."""
    return formats.kube_time(time.time())


def manager_for(field_manager: str, user_agent: str) -> str:
    """The manager an Update is recorded under: ``fieldManager``, else the User-Agent up to its first ``/``,
    unprintable characters dropped, at most 128 bytes (apiserver handlers/create.go:259-285)."""
    if field_manager:
        return field_manager
    out = ""
    for char in user_agent.split("/", maxsplit=1)[0]:
        if not char.isprintable() and unicodedata.category(char) != "Zs":
            continue
        if len((out + char).encode()) > FIELD_MANAGER_MAX:
            break
        out += char
    return out


# --- path elements --------------------------------------------------------------------------------------------------
def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


def item_element(item: Any, shape: ListType, index: int) -> str:
    """The path element of one list item: ``k:`` for an associative list (its key fields, defaults filled in),
    ``v:`` for a set, ``i:`` for anything else."""
    if shape.relationship == "map" and isinstance(item, dict):
        key = {}
        for name in shape.keys:
            value = item.get(name, KEY_DEFAULTS.get(name))
            if value is not None:
                key[name] = value
        return "k:" + _json(key)
    if shape.relationship == "set":
        return "v:" + _json(item)
    return f"i:{index}"


def _element_string(element: str) -> str:
    """One element as fieldpath.PathElement.String writes it (fieldpath/element.go:139-157)."""
    tag, body = element[:1], element[2:]
    if tag == "f":
        return "." + body
    if tag == "k":
        return "[" + ",".join(f"{k}={_go_value(v)}" for k, v in sorted(json.loads(body).items())) + "]"
    if tag == "v":
        return f"[={_go_value(json.loads(body))}]"
    return f"[{body}]"


def _go_value(value: Any) -> str:
    """value.ToString (structured-merge-diff value/value.go:218-248): strings quoted, the rest as Go prints them."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ",".join(_go_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "".join(f"{k}={_go_value(v)}" for k, v in value.items())
    return str(value)


def path_string(path: Path) -> str:
    """A path as a conflict names it: ``.spec.containers[name="c"].image``."""
    return "".join(_element_string(e) for e in path)


def _path_order(path: Path) -> tuple[tuple[int, str], ...]:
    # PathElement.Compare (fieldpath/element.go:56-99): field names, then keys, then values, then indices.
    return tuple(("fkvi".index(e[0]), e[2:]) for e in path)


# --- fieldsV1 -------------------------------------------------------------------------------------------------------
def to_fields_v1(paths: set[Path]) -> dict[str, Any]:
    """A set as its ``fieldsV1`` tree: each path a nested key, ``{}`` at a leaf, ``".": {}`` for a member that also
    has children (fieldpath/serialize.go)."""
    tree: dict[str, Any] = {}
    for path in paths:
        node = tree
        for element in path:
            node = node.setdefault(element, {})
    for path in paths:
        node = tree
        for element in path:
            node = node[element]
        if node:
            node["."] = {}

    def ordered(node: dict[str, Any]) -> dict[str, Any]:
        keys = sorted((k for k in node if k != "."), key=lambda e: _path_order((e,)))
        return {**({".": {}} if "." in node else {}), **{k: ordered(node[k]) for k in keys}}

    return ordered(tree)


def from_fields_v1(tree: dict[str, Any], prefix: Path = ()) -> set[Path]:
    """The set a ``fieldsV1`` tree encodes."""
    out: set[Path] = set()
    for key, sub in tree.items():
        if key == ".":
            out.add(prefix)
        elif isinstance(sub, dict) and sub:
            out |= from_fields_v1(sub, (*prefix, key))
        else:
            out.add((*prefix, key))
    return out


def strip(paths: set[Path]) -> set[Path]:
    """The set without the paths no manager may own."""
    return {p for p in paths if p not in STRIPPED and not any(p[: len(s)] == s for s in STRIPPED_UNDER)}


# --- the structured view of an object -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Shape:
    """The kind a walk is in (for :func:`sandbox.kube_patch.list_type`)."""

    group_version: str
    kind: str

    def list_type(self, names: tuple[str, ...]) -> ListType:
        """How the list at field names ``names`` merges."""
        return list_type(self.group_version, self.kind, names)


def _items(value: list[Any], shape: ListType) -> list[tuple[str, Any]]:
    return [(item_element(item, shape, i), item) for i, item in enumerate(value)]


def field_set(obj: dict[str, Any], shape: Shape) -> set[Path]:
    """The fields an object (an applied configuration) sets (typed/tofieldset.go): every scalar and atomic list,
    every list item; a map is only its fields, an empty map nothing."""
    out: set[Path] = set()
    _collect(obj, (), (), shape, out)
    return strip(out)


def _collect(value: Any, names: tuple[str, ...], path: Path, shape: Shape, out: set[Path]) -> None:
    if isinstance(value, dict):
        for key, child in value.items():
            _collect(child, (*names, key), (*path, f"f:{key}"), shape, out)
        return
    if isinstance(value, list) and names:
        kind = shape.list_type(names)
        if kind.relationship != "atomic":
            for element, item in _items(value, kind):
                out.add((*path, element))
                if kind.relationship == "map":
                    _collect(item, names, (*path, element), shape, out)
            return
    out.add(path)


@dataclass
class Comparison:
    """What changed between two versions of an object (typed/compare.go)."""

    added: set[Path] = field(default_factory=set)
    modified: set[Path] = field(default_factory=set)
    removed: set[Path] = field(default_factory=set)

    @property
    def changed(self) -> set[Path]:
        """Added or modified: what an owner of these fields would conflict on."""
        return self.added | self.modified


def compare(old: Any, new: Any, shape: Shape) -> Comparison:
    """Added, modified and removed paths from ``old`` to ``new``: a leaf (scalar, atomic list, empty map) that
    appears, disappears or changes; a map or list item that appears or disappears, with everything under it."""
    out = Comparison()
    _Comparer(shape, out).walk(old, new, (), ())
    return out


def _is_leaf(value: Any, names: tuple[str, ...], shape: Shape) -> bool:
    if isinstance(value, list):
        return not names or shape.list_type(names).relationship == "atomic"
    return not isinstance(value, dict)


@dataclass
class _Comparer:
    shape: Shape
    out: Comparison

    def walk(self, old: Any, new: Any, names: tuple[str, ...], path: Path) -> None:
        shape, out = self.shape, self.out
        present = new if new is not _MISSING else old
        empty_maps = all(v is _MISSING or v is None or v == {} for v in (old, new)) and isinstance(present, dict)
        mismatched = (
            old is not _MISSING and new is not _MISSING and type(old) is not type(new) and None not in (old, new)
        )
        if _is_leaf(present, names, shape) or empty_maps or mismatched:
            if old is _MISSING:
                out.added.add(path)
            elif new is _MISSING:
                out.removed.add(path)
            elif old != new:
                out.modified.add(path)
            return
        if isinstance(present, dict):
            old_map = old if isinstance(old, dict) else {}
            new_map = new if isinstance(new, dict) else {}
            for key in {**old_map, **new_map}:
                self.walk(old_map.get(key, _MISSING), new_map.get(key, _MISSING), (*names, key), (*path, f"f:{key}"))
        else:
            self._walk_list(old, new, names, path)
        if old is _MISSING:
            out.added.add(path)
        elif new is _MISSING:
            out.removed.add(path)

    def _walk_list(self, old: Any, new: Any, names: tuple[str, ...], path: Path) -> None:
        """A list's items: an associative list's item by item (their fields walked), a set's element by element."""
        kind = self.shape.list_type(names)
        old_items = dict(_items(old if isinstance(old, list) else [], kind))
        new_items = dict(_items(new if isinstance(new, list) else [], kind))
        for element in {**old_items, **new_items}:
            before, after = old_items.get(element, _MISSING), new_items.get(element, _MISSING)
            if kind.relationship == "map":
                self.walk(before, after, names, (*path, element))
            elif before is _MISSING:
                self.out.added.add((*path, element))
            elif after is _MISSING:
                self.out.removed.add((*path, element))


def merge(live: Any, config: Any, shape: Shape, names: tuple[str, ...] = ()) -> Any:
    """A configuration merged into the live object as server-side apply merges it (typed/merge.go): maps field by
    field, associative lists and sets item by item (in the order visitListItems gives, merge.go:168-282), anything
    else replaced by the configuration."""
    if isinstance(live, dict) and isinstance(config, dict):
        out = dict(live)
        for key, value in config.items():
            out[key] = merge(live.get(key, _MISSING), value, shape, (*names, key))
        return out
    if isinstance(live, list) and isinstance(config, list) and names:
        kind = shape.list_type(names)
        if kind.relationship != "atomic":
            return _merge_items(live, config, kind, shape, names)
    return copy.deepcopy(config)


def _merge_items(live: list[Any], config: list[Any], kind: ListType, shape: Shape, names: tuple[str, ...]) -> list[Any]:
    """visitListItems: live items keep their place, items both sides have follow the configuration's order, new
    configuration items go where the configuration puts them."""
    lhs, rhs = _items(live, kind), _items(config, kind)
    observed_l, observed_r = dict(lhs), dict(rhs)
    shared = [e for e, _ in rhs if e in observed_l]
    merged: set[str] = set()
    out: list[Any] = []

    def item(element: str) -> Any:
        right = observed_r[element]
        if kind.relationship == "map" and element in observed_l:
            return merge(observed_l[element], right, shape, names)
        return copy.deepcopy(right)

    li = ri = 0
    next_shared = shared.pop(0) if shared else None
    while li < len(lhs) or ri < len(rhs):
        if li < len(lhs) and ri < len(rhs):
            element = lhs[li][0]
            if element == rhs[ri][0]:
                merged.add(element)
                out.append(item(element))
                li, ri = li + 1, ri + 1
                next_shared = shared.pop(0) if shared else None
                continue
            if element in observed_r and next_shared is not None and next_shared != element:
                li += 1
                continue
        if li < len(lhs):
            element = lhs[li][0]
            if element not in observed_r:
                out.append(copy.deepcopy(lhs[li][1]))
                li += 1
                continue
            if element in merged:
                li += 1
        if ri < len(rhs):
            element = rhs[ri][0]
            merged.add(element)
            out.append(item(element))
            ri += 1
            if next_shared is not None and next_shared == element:
                next_shared = shared.pop(0) if shared else None
    return out


def remove_path(obj: Any, path: Path) -> None:
    """Drop the node at ``path`` from ``obj`` (in place), if it is there."""
    node = obj
    for depth, element in enumerate(path):
        last = depth == len(path) - 1
        if element.startswith("f:") and isinstance(node, dict):
            if last:
                node.pop(element[2:], None)
                return
            node = node.get(element[2:])
        elif isinstance(node, list):
            at = _find_item(node, element)
            if at is None:
                return
            if last:
                del node[at]
                return
            node = node[at]
        else:
            return


def _find_item(items: list[Any], element: str) -> int | None:
    tag, body = element[:1], element[2:]
    for i, item in enumerate(items):
        if tag == "i" and str(i) == body:
            return i
        if tag == "v" and _json(item) == body:
            return i
        if tag == "k" and isinstance(item, dict):
            key = json.loads(body)
            if all(item.get(k, KEY_DEFAULTS.get(k)) == v for k, v in key.items()):
                return i
    return None


# --- owners -----------------------------------------------------------------------------------------------------
def empty_object(shape: Shape) -> dict[str, Any]:
    """What the API server compares a create against: the kind's empty object (see :data:`EMPTY_BUILTIN`)."""
    return copy.deepcopy(EMPTY_BUILTIN.get(shape.kind, {})) if is_builtin(shape.group_version) else {}


def _take(managed: Managed, cmp: Comparison, keep: Owner | None, taken: set[Path]) -> None:
    """Other owners lose ``taken`` and whatever was removed (update.go:117-135); empty owners go."""
    for owner, owned in list(managed.owners.items()):
        if owner == keep:
            continue
        owned.fields -= taken | cmp.removed
        if not owned.fields:
            del managed.owners[owner]


def record_update(
    live: dict[str, Any] | None, new: dict[str, Any], managed: Managed, manager: str, shape: Shape
) -> Managed:
    """An Update (create, or a non-apply patch) by ``manager``: the fields it changed become its own and leave
    every other owner. An existing object nobody tracks stays untracked (skipnonapplied.go:61-77)."""
    if live is not None and not managed.owners:
        return managed
    _record(empty_object(shape) if live is None else live, new, managed, manager, shape)
    return managed


def _record(base: dict[str, Any], new: dict[str, Any], managed: Managed, manager: str, shape: Shape) -> None:
    # managedFieldsUpdater.Update (managedfieldsupdater.go:44-66): the operation's changes, merged into what the
    # same manager had; only an operation that changed something stamps the time.
    cmp = compare(base, new, shape)
    changed = strip(cmp.changed)
    _take(managed, cmp, None, changed)
    if changed:
        owner = Owner(manager, UPDATE, shape.group_version)
        previous = managed.owners.get(owner)
        fields = changed | (previous.fields if previous else set())
        managed.owners[owner] = Owned(fields, shape.group_version, now_rfc3339())


def apply(
    live: dict[str, Any] | None,
    config: dict[str, Any],
    managed: Managed,
    manager: str,
    shape: Shape,
    *,
    force: bool,
) -> dict[str, Any]:
    """Server-side apply of ``config`` by ``manager`` (structured-merge-diff Updater.Apply, update.go:176-213):
    the merged object (``managed`` updated in place), or ApplyConflict naming every field another owner holds
    with a different value, unless ``force``."""
    base = empty_object(shape) if live is None else live
    if live is not None and not managed.owners:
        # Fields set before anyone tracked them belong to "before-first-apply" (skipnonapplied.go:80-93).
        _record(empty_object(shape), live, managed, BEFORE_FIRST_APPLY, shape)
    owner = Owner(manager, APPLY)
    previous = managed.owners.get(owner)
    applied = field_set(config, shape)
    merged = merge(base, config, shape)
    if previous is not None:
        _prune(merged, previous.fields - applied, managed, owner, applied)
    cmp = compare(base, merged, shape)
    conflicts = {
        other: owned.fields & cmp.changed
        for other, owned in managed.owners.items()
        if other != owner and owned.fields & cmp.changed
    }
    if conflicts and not force:
        raise ApplyConflict(conflicts)
    _take(managed, cmp, owner, cmp.changed)
    stamp = previous.time if previous is not None and merged == base else now_rfc3339()
    managed.owners[owner] = Owned(applied, shape.group_version, stamp)
    if not applied:
        del managed.owners[owner]
    return merged


def _prune(obj: dict[str, Any], dropped: set[Path], managed: Managed, owner: Owner, applied: set[Path]) -> None:
    """Remove what the manager applied before and leaves out now, where nobody else owns it or anything under it
    (Updater.prune, update.go:215-241)."""
    owned = set(applied)
    for other, fields in managed.owners.items():
        if other != owner:
            owned |= fields.fields
    # Parents first: an item goes with what is under it (its key fields included, which find it).
    for path in sorted(dropped, key=len):
        if not any(p[: len(path)] == path for p in owned):
            remove_path(obj, path)
