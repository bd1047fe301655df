"""Text the package generates for people: the DAG's doc_md, and the conf reference and rule table of docs/."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from nemo_rl_gke.preflight.offline import rules
from nemo_rl_gke.run import topology
from nemo_rl_gke.run.conf_schema import spec_fields
from nemo_rl_gke.run.deployment import settings_markdown
from nemo_rl_gke.run.spec import default_conf

DAG_DESCRIPTION = "GRPO fine-tune with NVIDIA NeMo RL on GKE: provision, train, validate and export, tear down"
DAG_DOC_MD = """
### NeMo RL GRPO on GKE

Runs a GRPO fine-tune with NVIDIA NeMo RL on GKE, from an empty Google Cloud project back to nothing:
VPC and RDMA networks, a GKE cluster with a B200/H200 GPU pool, Managed Lustre with VPC peering, the GKE
network mapping, a KubeRay RayCluster, the GRPO job, checkpoint validation and teardown.

**Trigger** with the form (every parameter has a description) or the API with a JSON conf.
Unknown keys and bad values are rejected before anything is created:

* a wrong JSON type, enum value or range is refused by Airflow when the run is triggered;
* everything else (names, GPU/machine pairs, zone vs region, Lustre tiers, CIDR overlaps, NeMo RL parallelism and
  batch rules for the recipe's pinned version, override keys) fails the first task, `validate`, with one line per
  problem naming the parameter, the value, the rule and the fix.

**Modes**: `plan` lists every GCP request, manifest and the Ray job (secrets redacted) in the `plan` task's log
and XCom, creating nothing. `apply` provisions, trains (the `train.wait` log streams the job's output; its XCom
holds the per-step metrics), validates and exports the checkpoint (an event on this DAG's
`<dag_id>_checkpoint` Asset), tears down per `teardown_policy`, and ends with the `report` task.

Secrets (Hugging Face token, W&B key) come from Airflow connections the deployment allows (`[nemo_rl_gke]`
settings), never from the conf itself; the conf may only pick among them. The deployment, not the conf, also
decides any other Ray dashboard endpoint and where an NCCL installer may be downloaded from.
Docs: README.md, docs/conf-reference.md and docs/preflight-rules.md in the repository.
"""


def scheduled_dag_doc(schedule: Any) -> str:
    """The doc_md of a schedule's DAG: what the schedule does, from its file, then the run's own docs."""
    alerts = schedule.alerts
    deadline = f"{alerts.deadline_hours:g} h after it was queued" if alerts.deadline_hours else "none"
    targets = ", ".join(f"`{c}`" for c in alerts.connections) or "every connection in the deployment's alert_conn_ids"
    return f"""
### Schedule `{schedule.name}`: {schedule.description}

* **When**: `{schedule.cron}` ({schedule.timezone}); paused until you unpause it; no catch-up of missed nights.
* **Each run**: {schedule.steps_per_run} steps, resume `{schedule.resume}` (this DAG's own checkpoint lineage, on the
  `{topology.checkpoint_asset(schedule.dag_id)}` Asset).
* **When the previous run still holds the group**: {schedule.on_overlap}{
        f" (up to {schedule.overlap_wait_minutes:g} minutes)" if schedule.on_overlap == "wait" else ""
    }.
* **A warm group** idle more than {schedule.warm_ttl_hours:g} h is removed by the sweeper.
* **Alerts**: on failure and on a missed deadline ({deadline}), to {targets}.
* **File**: `include/schedules/{schedule.path.name}`.
{DAG_DOC_MD}"""


# Each task group's tooltip (what it does, in a line) and doc_md (what it does and what to do when it fails). Keyed by
# the topology's group names, so a group the topology adds without docs fails the DAG-integrity test.
GROUP_DOCS: dict[str, tuple[str, str]] = {
    topology.NETWORK: (
        "The three VPCs (main, gVNIC, RDMA), their subnets and the gVNIC firewall rule",
        """Creates or adopts the main VPC (cluster and Lustre), the gVNIC VPC and subnet with its internal firewall
rule, and the RDMA VPC on the zone's RoCE network profile with its eight subnets.

**If it fails**: the task log names the resource, the API's answer and the operation. A name or range clash
(`already exists`, not created by this DAG) needs another name in the conf, or `adopt_existing`; a missing RoCE
profile means the zone has no A3 Ultra / A4 capacity. Teardown has already removed what was made: fix, re-trigger.""",
    ),
    topology.STORAGE: (
        "The private-services range, the Service Networking peering and the Managed Lustre instance",
        """Reserves the peering range on the main VPC, peers it with Service Networking, then creates Managed Lustre
(tens of minutes, waited for in the triggerer: no worker slot is held).

**If it fails**: a quota or capacity error is in the task log with the operation; a range overlap needs another
`peering_range_address`. Lustre's tier and capacity rules are checked by `validate` before anything is made. A
timeout (`storage_timeout_s`) is retried; teardown deletes what exists.""",
    ),
    topology.CLUSTER: (
        "The regional GKE cluster and its GPU node pool on the reservation",
        """Creates the GKE cluster (Ray operator and Lustre CSI add-ons, multi-networking) and the GPU pool with the
gVNIC and RDMA NICs on the conf's reservation.

**If it fails**: the pool needs the reservation in the zone with enough machines (`preflight_live` checks it) and
the GPU quota; the task log has GKE's message. Operations already running are adopted by a retry, never doubled.""",
    ),
    topology.KUBE: (
        "The NCCL RDMA installer, the network mapping, the Lustre PV/PVC and the RayCluster",
        """Applies the Kubernetes objects server-side and waits for the RayCluster's HeadPodReady and
RayClusterProvisioned conditions.

**If it fails**: an image pull or an unschedulable pod shows in the RayCluster's events (the log quotes them);
`kube_timeout_s` bounds the wait. Fix the cause and clear the task: applying again is idempotent.""",
    ),
    topology.TRAIN: (
        "Submits the GRPO job once and follows it, deferred (the Training tab shows its curves)",
        """`submit` sends the job to the RayCluster (exactly once per run); `wait` follows it in the triggerer,
streams its log into the task log and its step metrics into XCom. The run's **Training** tab shows step N of M,
the curves, ETA, cost so far and what is still running.

**If it fails**: the task log ends with Ray's message, the driver's exit code and its last lines. The zero-learning
guard stops a job whose rewards are all equal (see the message for the steps); a timeout stops it after
`job_timeout_s`. Checkpoints already saved stay on Lustre, which teardown keeps until they are exported.""",
    ),
    topology.CHECKPOINT: (
        "Validates the final checkpoint where it lives, then exports it to Cloud Storage",
        """`validate` reads the checkpoint's metadata in the cluster (every tensor covered, every shard present);
`export` copies it to `gs://` with Lustre's exportData and publishes the Asset event.

**If it fails**: the checkpoint is still on Lustre (the log says where) and teardown keeps the instance. Export it
by hand or re-run the export; `accept_checkpoint_loss=true` lets teardown delete it anyway.""",
    ),
    topology.TEARDOWN: (
        "Deletes what this run created, in an order that works, per the teardown policy",
        """Runs after any failure. Deletes the RayCluster, the other objects, Lustre (only once its checkpoint is
exported), the peering and range, the cluster, then the subnets and networks; 404 counts as done.

**If it fails**: the task log names what is left; the run fails only when a network could not be deleted (anything
still inside one makes that fail). Clear the failed task to retry, or delete by hand what the run report lists.
The Training tab's banner lists every resource still up with its cost per hour.""",
    ),
}


SWEEPER_DESCRIPTION = "Deletes what no NeMo RL GKE run will tear down: crashed runs' resources, idle warm groups"
SWEEPER_DOC_MD = """
### NeMo RL GKE sweeper

Every hour, reads the project's run-group leases and deletes what no run will tear down any more, for this
deployment only (`[nemo_rl_gke] deployment_id`):

* a group whose lease expired and whose run is no longer queued or running (a run killed mid-way, teardown never ran);
* a warm group (its last run kept the cluster and storage) idle longer than `warm_ttl_hours` (a scheduled group:
  its schedule file's own);
* leftovers of a group whose last run released it with nothing kept (a failed teardown).

It deletes in the runs' teardown order, holding the group's lease meanwhile, and never deletes another
deployment's or a foreign resource, nor a Lustre instance holding a checkpoint no export has copied (with the
peering, range and network it needs). Waits are deferred. The task log shows the report (found, deleted, kept and
why, skipped and why); its XCom holds it as a dict. `dry_run: true` reports what it would do and writes nothing.

Paused at creation: unpause it to enable it. Docs: docs/sweeper.md in the repository.
"""


def rules_markdown() -> str:
    """The preflight rules as a Markdown table: id, what it checks, and a conf that trips it."""
    lines = [
        "| rule | category | checks | a conf that trips it |",
        "| --- | --- | --- | --- |",
    ]
    for rule in rules():
        example = json.dumps(rule.example)
        if rule.example_recipe:
            example += f" with the recipe patched to {json.dumps(rule.example_recipe)}"
        lines.append(f"| `{rule.rule_id}` | {rule.category} | {rule.title} | `{example}` |")
    return "\n".join(lines) + "\n"


def _kind(row: dict[str, Any]) -> str:
    kinds = row["type"] if isinstance(row["type"], list) else [row["type"]]
    kind = " or ".join(kinds)
    if "enum" in row:
        return kind + " (" + ", ".join(str(v) for v in row["enum"]) + ")"
    bounds = [f"{row[k]:,}" if isinstance(row[k], int) else str(row[k]) for k in ("minimum", "maximum") if k in row]
    if len(bounds) == 2:
        kind += f", {bounds[0]}..{bounds[1]}"
    if "maxLength" in row:
        kind += f", at most {row['maxLength']} characters"
    if "maxItems" in row:
        kind += f", at most {row['maxItems']} items"
    return kind


def params_markdown(rows: list[dict[str, Any]]) -> str:
    """The conf parameters as Markdown, one table per form section: name, type, default, meaning."""
    out: list[str] = []
    section = None
    for row in rows:
        if row["section"] != section:
            section = row["section"]
            out += ["", f"## {section}", "", "| parameter | type | default | meaning |", "| --- | --- | --- | --- |"]
        kind = _kind(row)
        meaning = str(row["description"]).replace("|", "\\|")
        out.append(f"| `{row['name']}` | {kind} | `{json.dumps(row['default'])}` | {meaning} |")
    return "\n".join(out).lstrip("\n") + "\n"


# Generated blocks of the docs: (file under docs/, the block's first line, the line after the block or "" for the
# end of the file). `python -m nemo_rl_gke docs` rewrites them; the tests fail when one is out of date.
GENERATED_BLOCKS: tuple[tuple[str, str, str], ...] = (
    ("preflight-rules.md", "| rule | category |", "## Troubleshooting by rule"),
    ("conf-reference.md", "## Run\n", "## Deployment settings"),
    ("conf-reference.md", "| setting | environment variable |", ""),
)


def generated_block(start: str) -> str:
    """The current text of the generated block that begins with ``start``."""
    if start.startswith("| rule"):
        return rules_markdown()
    if start.startswith("## Run"):
        defaults = default_conf()
        rows = [
            {"name": f.name, "section": f.metadata["section"], "default": defaults[f.name], **f.metadata["schema"]}
            for f in spec_fields()
        ]
        return params_markdown(rows)
    return settings_markdown()


def refresh_docs(docs_dir: Path) -> list[str]:
    """Rewrite every generated block under ``docs_dir``; returns the files that changed."""
    changed = []
    for name, start, end in GENERATED_BLOCKS:
        path = docs_dir / name
        text = path.read_text()
        head = text.index(start)
        tail = text.index(end, head) if end else len(text)
        block = generated_block(start).rstrip("\n") + ("\n\n" if end else "\n")
        updated = text[:head] + block + text[tail:]
        if updated != text:
            path.write_text(updated)
            changed.append(name)
    return changed
