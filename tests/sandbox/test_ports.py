"""Ports handed to a process that binds them later are never ones the kernel hands out on its own."""

from __future__ import annotations

import socket

import pytest

from sandbox import ports


def test_ports_are_distinct_free_and_below_the_kernels_ephemeral_range() -> None:
    start = ports._ephemeral_start()
    chosen = ports.free_ports(7)
    assert len(set(chosen)) == 7
    assert all(ports.LOWEST <= port < start for port in chosen)
    for port in chosen:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.bind((ports.HOST, port))


def test_a_port_the_kernel_gave_another_socket_is_never_chosen(monkeypatch: pytest.MonkeyPatch) -> None:
    # A socket bound to a port from the chosen range: the picker skips it even when the random draw lands on it.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind((ports.HOST, ports.free_port()))
        busy = taken.getsockname()[1]
        draws = iter([busy, busy, busy + 1 if busy + 1 < ports._ephemeral_start() else busy - 1])
        monkeypatch.setattr(ports.random, "randrange", lambda low, high: next(draws))
        assert ports.free_ports(1) != [busy]


def test_a_range_too_small_is_refused_with_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ports, "_ephemeral_start", lambda: ports.LOWEST + 5)
    with pytest.raises(RuntimeError, match="ephemeral port range starts at 20005"):
        ports.free_ports(1)
