"""Command line: ``python -m nemo_rl_gke {validate,plan,params,rules,settings} ...`` (no Airflow, no cloud access).

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

from nemo_rl_gke.docs import params_markdown, refresh_docs, rules_markdown
from nemo_rl_gke.preflight.offline import check_conf
from nemo_rl_gke.run.conf_schema import spec_fields
from nemo_rl_gke.run.deployment import SETTINGS_DOC, Deployment, settings_markdown
from nemo_rl_gke.run.findings import format_findings
from nemo_rl_gke.run.recipes import notices_of
from nemo_rl_gke.run.spec import default_conf


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
    defaults = default_conf()
    rows = [
        {"name": f.name, "section": f.metadata["section"], "default": defaults[f.name], **f.metadata["schema"]}
        for f in spec_fields()
    ]
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
