"""``python -m sandbox serve --port N --state DIR [--latency-scale F] [--seed FILE]``.

It binds 127.0.0.1 only: there is deliberately no option to listen anywhere else.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from pathlib import Path

from sandbox.config import Config, SeedError


def parser() -> argparse.ArgumentParser:
    """The command line."""
    root = argparse.ArgumentParser(prog="python -m sandbox", description=__doc__.splitlines()[0])
    commands = root.add_subparsers(dest="command", required=True)
    run = commands.add_parser("serve", help="serve the Google Cloud REST APIs on 127.0.0.1 until SIGTERM/SIGINT")
    run.add_argument("--port", type=int, required=True, help="TCP port on 127.0.0.1 (0 picks a free one)")
    run.add_argument("--state", type=Path, required=True, help="state directory (created; reloaded on restart)")
    run.add_argument(
        "--latency-scale",
        type=float,
        default=1.0,
        help="multiplies every operation's latency (1 is roughly real time; 0 makes operations instant)",
    )
    run.add_argument(
        "--seed",
        type=Path,
        help="JSON seed file: roce_zones, enabled_services, reservations, latency_seconds, quotas",
    )
    return root


def main(argv: list[str] | None = None) -> int:
    """Run the command line."""
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if args.latency_scale < 0:
        print("--latency-scale must be >= 0", file=sys.stderr)
        return 2
    if args.seed is not None:
        # Checked before the slow imports below, so a bad seed fails fast.
        try:
            Config().apply_seed(json.loads(args.seed.read_text(encoding="utf-8")), 0.0)
        except (OSError, ValueError, TypeError, SeedError) as exc:
            print(f"--seed {args.seed}: {exc}", file=sys.stderr)
            return 2
    # Imported after parsing: a usage error answers at once, without loading the Google client libraries.
    from sandbox.server import serve

    asyncio.run(serve(args.port, args.state, args.latency_scale, args.seed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
