"""What a step did to its resource: the action words every task returns, the report counts and the grid shows."""

from __future__ import annotations

CREATED = "created"
ADOPTED = "adopted"  # someone else's resource, used as it is and never deleted
EXISTS = "exists"  # ours already, reused
DELETED = "deleted"
ABSENT = "absent"  # nothing to delete (already gone: 404 counts as done)
EXPORTED = "exported"
KEPT_BY_POLICY = "kept-by-policy"
KEPT_UNOWNED = "kept-unowned"  # another deployment's or group's, or adopted: never deleted
KEPT_UNUSED = "kept-unused"  # ours, but this run refused it or never reached it: left for the run that uses it
KEPT_LEASE_LOST = "kept-lease-lost"  # the run no longer holds its group's lease: it deletes nothing
KEPT_FOR_CHECKPOINT = "kept-for-checkpoint"
KEPT_FOR_LUSTRE = "kept-for-lustre"
SCALED_TO_ZERO = "scaled-to-zero"  # a GPU pool of a cluster kept warm: no node until the next run needs one
NOT_NEEDED = "not-needed"  # a teardown step with nothing to do under the policy (the pool goes with its cluster)
IMPORTED = "imported"  # a checkpoint copied from Cloud Storage into Lustre to resume from
# After these the resource is gone.
GONE = frozenset({DELETED, ABSENT})
KEPT = frozenset({KEPT_BY_POLICY, KEPT_UNOWNED, KEPT_UNUSED, KEPT_LEASE_LOST, KEPT_FOR_CHECKPOINT, KEPT_FOR_LUSTRE})
