"""What a step did to its resource: the action words every task returns, the report counts and the grid shows."""

from __future__ import annotations

CREATED = "created"
ADOPTED = "adopted"  # someone else's resource, used as it is and never deleted
EXISTS = "exists"  # ours already, reused
DELETED = "deleted"
ABSENT = "absent"  # nothing to delete (already gone: 404 counts as done)
EXPORTED = "exported"
KEPT_BY_POLICY = "kept-by-policy"
KEPT_UNOWNED = "kept-unowned"
KEPT_FOR_CHECKPOINT = "kept-for-checkpoint"
KEPT_FOR_LUSTRE = "kept-for-lustre"
# After these the resource is gone.
GONE = frozenset({DELETED, ABSENT})
KEPT = frozenset({KEPT_BY_POLICY, KEPT_UNOWNED, KEPT_FOR_CHECKPOINT, KEPT_FOR_LUSTRE})
