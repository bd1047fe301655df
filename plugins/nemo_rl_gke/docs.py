"""Text the package generates for people: the DAG's doc_md, and the conf reference and rule table of docs/."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

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
holds the per-step metrics), validates and exports the checkpoint (an event on the
`nemo_rl_grpo_gke_checkpoint` Asset), tears down per `teardown_policy`, and ends with the `report` task.

Secrets (Hugging Face token, W&B key) come from Airflow connections the deployment allows (`[nemo_rl_gke]`
settings), never from the conf itself; the conf may only pick among them. The deployment, not the conf, also
decides any other Ray dashboard endpoint and where an NCCL installer may be downloaded from.
Docs: README.md, docs/conf-reference.md and docs/preflight-rules.md in the repository.
"""


SWEEPER_DESCRIPTION = "Deletes what no NeMo RL GKE run will tear down: crashed runs' resources, idle warm groups"
SWEEPER_DOC_MD = """
### NeMo RL GKE sweeper

Every hour, reads the project's run-group leases and deletes what no run will tear down any more, for this
deployment only (`[nemo_rl_gke] deployment_id`):

* a group whose lease expired and whose run is no longer queued or running (a run killed mid-way, teardown never ran);
* a warm group (its last run kept the cluster and storage) idle longer than `warm_ttl_hours`;
* leftovers of a group whose last run released it with nothing kept (a failed teardown).

It deletes in the runs' teardown order, holding the group's lease meanwhile, and never deletes another
deployment's or a foreign resource, nor a Lustre instance holding a checkpoint no export has copied (with the
peering, range and network it needs). Waits are deferred. The task log shows the report (found, deleted, kept and
why, skipped and why); its XCom holds it as a dict. `dry_run: true` reports what it would do and writes nothing.

Paused at creation: unpause it to enable it. Docs: docs/sweeper.md in the repository.
"""


def rules_markdown() -> str:
    """The preflight rules as a Markdown table: id, what it checks, and a conf that trips it."""
    from nemo_rl_gke.preflight import rules

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
    from nemo_rl_gke.deployment import settings_markdown
    from nemo_rl_gke.spec import default_conf, spec_fields

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
