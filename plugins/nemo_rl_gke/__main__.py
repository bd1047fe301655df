"""Command line: ``python -m nemo_rl_gke {validate,plan,params,rules,settings,docs} ...`` (no Airflow, no cloud).

``validate`` and ``plan`` are the same code the DAG's ``validate`` and ``plan`` tasks run, so a conf can be
checked and reviewed on a laptop before it is triggered. The deployment's settings come from the same environment
variables Airflow reads (``AIRFLOW__NEMO_RL_GKE__*``), with their defaults when unset.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from nemo_rl_gke.preflight.offline import check_conf, rules
from nemo_rl_gke.run.conf_schema import default_conf, spec_fields
from nemo_rl_gke.run.deployment import SETTINGS_DOC, Deployment, settings_markdown
from nemo_rl_gke.run.findings import format_findings
from nemo_rl_gke.run.recipes import notices_of


def param_rows() -> list[dict[str, Any]]:
    """Every conf parameter as a row: name, form section, default and its JSON schema (type, bounds, meaning)."""
    defaults = default_conf()
    return [
        {"name": f.name, "section": f.metadata["section"], "default": defaults[f.name], **f.metadata["schema"]}
        for f in spec_fields()
    ]


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
        return params_markdown(param_rows())
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


def _load_conf(path: str) -> dict[str, Any]:
    text = sys.stdin.read() if path == "-" else Path(path).read_text()
    conf = json.loads(text) if text.strip() else {}
    if not isinstance(conf, dict):
        raise SystemExit(f"error: {path} must hold a JSON object (the DAG run conf), not {type(conf).__name__}")
    return conf


def _cmd_validate(args: argparse.Namespace) -> int:
    spec, findings = check_conf(_load_conf(args.conf), Deployment.from_env())
    notices = notices_of(spec)
    if args.format == "json":
        body = {"valid": spec is not None, "findings": [f.to_dict() for f in findings], "notices": notices}
        print(json.dumps(body, indent=2))
    elif findings:
        print(format_findings(findings))
    else:
        print(f"OK: conf is valid ({spec.recipe}, {spec.worker_replicas} x {spec.gpu_type} nodes, mode {spec.mode})")
        for notice in notices:
            print(f"Notice: {notice}")
    return 0 if spec is not None else 1


def _cmd_plan(args: argparse.Namespace) -> int:
    # lazy: the cloud clients (gcp/, kube.client, triggers/) stay out of DAG parsing
    from nemo_rl_gke.plan.build import build_plan

    deployment = Deployment.from_env()
    spec, findings = check_conf(_load_conf(args.conf), deployment)
    if spec is None:
        print(format_findings(findings), file=sys.stderr)
        return 1
    plan = build_plan(spec, deployment=deployment)
    print(json.dumps(plan.to_dict(), indent=2) if args.format == "json" else plan.to_text())
    return 0


def _cmd_params(args: argparse.Namespace) -> int:
    rows = param_rows()
    if args.format == "json":
        print(json.dumps(rows, indent=2))
        return 0
    if args.format == "markdown":
        print(params_markdown(rows), end="")
        return 0
    for row in rows:
        allowed = f" one of {row['enum']}" if "enum" in row else ""
        print(f"{row['name']} ({row['type']}{allowed}) = {json.dumps(row['default'])}\n    {row['description']}")
    return 0


def _cmd_rules(args: argparse.Namespace) -> int:
    print(rules_markdown(), end="")
    return 0


def _cmd_settings(args: argparse.Namespace) -> int:
    if args.format == "markdown":
        print(settings_markdown(), end="")
        return 0
    current = Deployment.from_env()
    for name, _, meaning in SETTINGS_DOC:
        value = getattr(current, name)
        shown = " ".join(value) if isinstance(value, tuple) else value
        print(f"{name} = {shown!s}\n    {meaning}")
    print(
        f"(Google connection's project) = {current.gcp_project or '(none)'}\n    Always an allowed project: the "
        "project extra of AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT here, of the google_cloud_default connection in Airflow."
    )
    return 0


def _cmd_docs(args: argparse.Namespace) -> int:
    # lazy: read at call time, so tests and deployments can re-point the paths
    from nemo_rl_gke.run.paths import PROJECT_ROOT

    changed = refresh_docs(PROJECT_ROOT / "docs")
    print("updated: " + ", ".join(changed) if changed else "the generated docs are up to date")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Parse the command line and run one subcommand; returns the process exit code."""
    parser = argparse.ArgumentParser(prog="python -m nemo_rl_gke", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name, func, text in (
        ("validate", _cmd_validate, "offline preflight of a run conf: every violated rule, with its fix"),
        ("plan", _cmd_plan, "every GCP request, manifest and the Ray job a run would make, creating nothing"),
    ):
        cmd = sub.add_parser(name, help=text)
        cmd.add_argument("--conf", default="-", help="JSON file with the DAG run conf ('-' for stdin)")
        cmd.add_argument("--format", choices=["text", "json"], default="text")
        cmd.set_defaults(func=func)
    params = sub.add_parser("params", help="every conf parameter with its type, default and meaning")
    params.add_argument("--format", choices=["text", "json", "markdown"], default="text")
    params.set_defaults(func=_cmd_params)
    sub.add_parser("rules", help="the preflight rules as a Markdown table").set_defaults(func=_cmd_rules)
    settings = sub.add_parser("settings", help="the deployment's settings ([nemo_rl_gke]) and their values here")
    settings.add_argument("--format", choices=["text", "markdown"], default="text")
    settings.set_defaults(func=_cmd_settings)
    sub.add_parser("docs", help="rewrite the generated tables in docs/ (rules, parameters, settings)").set_defaults(
        func=_cmd_docs
    )
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
