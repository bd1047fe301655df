"""The validator's command line: ``python -m remote validate DIR --expect '{json}'`` in the Ray job."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable
from pathlib import Path

from .expectation import Expectation, ExpectationError
from .report import MARKER
from .steps import list_step_dirs
from .validator import validate_checkpoint

DESCRIPTION = "Validate a NeMo RL GRPO checkpoint before it is exported and Lustre is deleted."


def _load_expectation(args: argparse.Namespace) -> Expectation:
    if args.expect_file is not None:
        text = sys.stdin.read() if args.expect_file == "-" else Path(args.expect_file).read_text()
    else:
        text = args.expect or "{}"
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ExpectationError(f"the expectation is not valid JSON: {exc}") from exc
    return Expectation.from_dict(data)


def main(argv: Iterable[str] | None = None) -> int:
    """Command line entry point; returns 0 (valid), 1 (invalid) or 2 (usage error)."""
    parser = argparse.ArgumentParser(description=DESCRIPTION)
    sub = parser.add_subparsers(dest="command", required=True)
    validate = sub.add_parser("validate", help="validate checkpoint_dir/step_N against an expectation")
    validate.add_argument("checkpoint_dir", help="the run's checkpointing.checkpoint_dir (parent of step_N)")
    source = validate.add_mutually_exclusive_group()
    source.add_argument("--expect", help='expectation as JSON, e.g. \'{"step": 20, "training_ranks": 16}\'')
    source.add_argument("--expect-file", help="file holding the expectation JSON ('-' for stdin)")
    validate.add_argument(
        "--format", choices=("json", "text"), default="json", help="json: one marker line (default); text: for people"
    )
    validate.add_argument("--list-steps", metavar="MOUNT", help="also list every step_N directory under MOUNT")
    args = parser.parse_args(None if argv is None else list(argv))
    try:
        report = validate_checkpoint(args.checkpoint_dir, _load_expectation(args))
    except (ExpectationError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.list_steps:
        report.steps_present = list_step_dirs(args.list_steps)
    if args.format == "text":
        print(report.to_text())
    else:
        # The human summary goes to stderr so stdout stays one machine-readable line; Ray's job log keeps both.
        print(report.to_text(), file=sys.stderr)
        print(MARKER + json.dumps(report.to_dict(), sort_keys=True, default=str), flush=True)
    return 0 if report.valid else 1
