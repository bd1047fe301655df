"""The publish policy's words and the publish decision's outcomes, as the conf, the alerts and the report name them.

The decision itself is :func:`nemo_rl_gke.decide.publish.decide`. Pure and stdlib-only.
"""

from __future__ import annotations

ALWAYS = "always"
IF_BETTER = "if_better"
NEVER = "never"
# Decisions.
PROMOTED = "promoted"
NOT_PROMOTED = "not-promoted"
NOT_PUBLISHED = "not-published"
