"""Ports for a listener that another process binds a moment later (a sandbox, a Ray head).

``bind(port 0)`` then close hands out a port from the kernel's ephemeral range, which every ``connect`` and every
``bind(0)`` on the machine draws from too: in the second before the other process binds it, a Ray worker or a client
socket of a parallel test can take it, and that Ray head then dies at start. Ports below the ephemeral range are
never handed out by the kernel, so only another caller of this module could race for one, and it draws at random.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

HOST = "127.0.0.1"
EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
# Linux's default ephemeral range starts at 32768; below it, ports under 20000 are left to well-known services.
LOWEST = 20000
DEFAULT_EPHEMERAL_START = 32768
ATTEMPTS = 200


def _ephemeral_start() -> int:
    try:
        return int(EPHEMERAL_RANGE_FILE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return DEFAULT_EPHEMERAL_START


def free_ports(count: int) -> list[int]:
    """``count`` distinct ports on 127.0.0.1, free now and outside the kernel's ephemeral range."""
    top = _ephemeral_start()
    if top - LOWEST < count * 10:
        raise RuntimeError(f"the ephemeral port range starts at {top}: too few ports below it for {count} listeners")
    chosen: list[int] = []
    for _ in range(ATTEMPTS):
        port = random.randrange(LOWEST, top)
        if port in chosen:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            try:
                probe.bind((HOST, port))
            except OSError:
                continue
        chosen.append(port)
        if len(chosen) == count:
            return chosen
    raise RuntimeError(f"no {count} free ports on {HOST} between {LOWEST} and {top} after {ATTEMPTS} tries")


def free_port() -> int:
    """One port on 127.0.0.1, free now and outside the kernel's ephemeral range."""
    return free_ports(1)[0]
