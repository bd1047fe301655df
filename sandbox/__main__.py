"""``python -m sandbox serve --port N --state DIR [--latency-scale F] [--seed FILE] [--token-lifetime S]``, and
``python -m sandbox credentials --url URL [--out FILE] [--project P] [--wait S]``,
``python -m sandbox get-credentials CLUSTER --location L --project P --url URL [--key FILE] [--kubeconfig FILE]``
and ``python -m sandbox auth-plugin --key FILE`` (the kubeconfig's exec plugin).

It binds 127.0.0.1 only: there is deliberately no option to listen anywhere else. ``credentials`` writes the running
sandbox's service-account key file and prints the ``AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT`` value that reaches it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import time
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
    run.add_argument(
        "--token-lifetime",
        type=float,
        default=3600.0,
        help="seconds an issued access token (and a self-signed JWT, from its iat) stays valid (default 3600)",
    )
    creds = commands.add_parser(
        "credentials", help="write a running sandbox's key file and print the google_cloud_default connection for it"
    )
    creds.add_argument("--url", required=True, help="the sandbox, e.g. http://127.0.0.1:8931")
    creds.add_argument(
        "--out", type=Path, default=Path(".airflow/sandbox-key.json"), help="where to write the JSON key file"
    )
    creds.add_argument("--project", default="nemo-rl-demo", help="the connection's project extra")
    creds.add_argument(
        "--wait",
        type=float,
        default=0.0,
        help="seconds to wait for a sandbox that is still starting (one just started in the background)",
    )
    kube = commands.add_parser(
        "get-credentials", help="add a running sandbox GKE cluster to the kubeconfig, as gcloud container clusters does"
    )
    kube.add_argument("cluster", help="the GKE cluster's name")
    kube.add_argument("--location", required=True, help="the cluster's location (region or zone)")
    kube.add_argument("--project", required=True, help="the cluster's project")
    kube.add_argument("--url", required=True, help="the sandbox, e.g. http://127.0.0.1:8931")
    kube.add_argument(
        "--key", type=Path, default=Path(".airflow/sandbox-key.json"), help="the key file `credentials` wrote"
    )
    kube.add_argument(
        "--kubeconfig",
        type=Path,
        default=Path(os.environ.get("KUBECONFIG", "").split(os.pathsep)[0] or Path.home() / ".kube" / "config"),
        help="the kubeconfig to add it to (default: $KUBECONFIG, else ~/.kube/config)",
    )
    plugin = commands.add_parser("auth-plugin", help="print an ExecCredential with a sandbox access token (kubectl)")
    plugin.add_argument("--key", type=Path, required=True, help="the sandbox's key file")
    return root


def get_credentials(args: argparse.Namespace) -> int:
    """Write the cluster's kubeconfig entry and say so as gcloud does."""
    from sandbox import kubeconfig
    from sandbox.testing import SandboxError, request_json

    if not args.key.exists():
        print(f"--key {args.key}: no key file; write it first with python -m sandbox credentials", file=sys.stderr)
        return 2
    path = f"{args.url.rstrip('/')}/v1/projects/{args.project}/locations/{args.location}/clusters/{args.cluster}"
    try:
        cluster = request_json(path)
        entry = kubeconfig.entry(cluster, args.project, args.location, args.key)
    except (OSError, SandboxError, ValueError) as exc:
        print(f"cannot get the credentials of cluster {args.cluster}: {exc}", file=sys.stderr)
        return 1
    kubeconfig.write(args.kubeconfig, entry)
    print("Fetching cluster endpoint and auth data.", file=sys.stderr)
    print(f"kubeconfig entry generated for {args.cluster}.", file=sys.stderr)
    return 0


def credentials(url: str, out: Path, project: str, wait_s: float = 0.0) -> int:
    """Write the key file (mode 0600) and print the connection JSON that names it; a sandbox that does not answer
    yet is asked again for up to ``wait_s`` seconds."""
    from sandbox.testing import SandboxError, connection_json, key_file

    deadline = time.monotonic() + wait_s
    while True:
        try:
            key = key_file(url)
            break
        except OSError as exc:  # refused or unreachable: a sandbox still starting answers within --wait
            if time.monotonic() < deadline:
                time.sleep(0.5)
                continue
            error: Exception = exc
        except SandboxError as exc:
            error = exc
        hint = "start one with python -m sandbox serve"
        print(f"--url {url}: no sandbox answers there ({error}); {hint}", file=sys.stderr)
        return 2
    out.parent.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
        json.dump(key, handle, indent=2)
    extra = {"key_path": str(out.resolve()), "project": project, "api_endpoint": url.rstrip("/")}
    print(f"wrote {out} (service account {key['client_email']}, token_uri {key['token_uri']})", file=sys.stderr)
    print(connection_json(extra))
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run the command line."""
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if args.command == "credentials":
        return credentials(args.url, args.out, args.project, args.wait)
    if args.command == "get-credentials":
        return get_credentials(args)
    if args.command == "auth-plugin":
        from sandbox.kubeconfig import exec_credential

        print(json.dumps(exec_credential(args.key)))
        return 0
    if args.token_lifetime <= 0:
        print("--token-lifetime must be > 0", file=sys.stderr)
        return 2
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

    # Absolute: Lustre's directories live under the state dir and the Ray jobs run in working dirs of their own, so a
    # relative --state (the README's `.sandbox`) would name another place in every job.
    asyncio.run(serve(args.port, args.state.resolve(), args.latency_scale, args.seed, args.token_lifetime))
    return 0


if __name__ == "__main__":
    sys.exit(main())
