"""The cluster CA as the clients get it: one bundle file per CA per process, gone when the process exits."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from sandbox.tls import new_cluster_tls

from nemo_rl_gke.kube.access import ClusterAccess, DashboardAddress, ca_bundle

REPO = Path(__file__).resolve().parents[2]


def test_one_bundle_file_per_ca_holding_exactly_that_ca() -> None:
    first, second = new_cluster_tls("a").ca_pem, new_cluster_tls("b").ca_pem
    path = ca_bundle(first)
    assert Path(path).read_text(encoding="ascii") == first
    # Every client of the same CA shares the file: asking again (per request, per poll) writes nothing new.
    assert ca_bundle(first) == path == ClusterAccess("https://127.0.0.1:1", first).ca_file()
    assert DashboardAddress("https://127.0.0.1:1/x", True, first).verify() == path
    other = ca_bundle(second)
    assert other != path and Path(other).parent == Path(path).parent
    # One file per CA (other tests of this process may have added their own CAs' files beside these).
    names = [p.name for p in Path(path).parent.iterdir()]
    assert names.count(Path(path).name) == 1 and names.count(Path(other).name) == 1
    assert not [n for n in names if not n.endswith(".crt")]  # no partial file left behind
    assert Path(path).parent.stat().st_mode & 0o077 == 0  # private to this user


def test_verification_is_never_off() -> None:
    # Without a CA the system's CAs verify (True), never False.
    assert DashboardAddress("https://ray.example", False).verify() is True
    assert ClusterAccess("https://34.1.2.3").ca_file() is None


def test_the_bundle_directory_goes_when_the_process_exits() -> None:
    script = (
        "from sandbox.tls import new_cluster_tls\n"
        "from nemo_rl_gke.kube.access import ca_bundle\n"
        "print(ca_bundle(new_cluster_tls('c').ca_pem))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=REPO,
        env={"PYTHONPATH": f"{REPO / 'plugins'}:{REPO}", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    path = Path(done.stdout.strip())
    assert path.name.endswith(".crt")
    assert not path.exists() and not path.parent.exists()
