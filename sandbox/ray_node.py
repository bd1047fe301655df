"""``ray start`` for a sandbox worker node: it joins a head on 127.0.0.1 and stays on loopback.

The sandbox's Ray runs with ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` so that nothing binds to the machine's own address
(see :mod:`sandbox.kuberay`). In that mode ``ray start --address`` refuses to join ("Multi-node Ray clusters are not
supported"), and with the flag on, ``ray start`` swaps 127.0.0.1 for the machine's address. This launcher lifts the
refusal inside its own process only, and keeps the node's address at 127.0.0.1; the processes it starts (raylet,
agents, workers) inherit the variable at 0 and so resolve loopback too. Seen with ray 2.60: two nodes, both
127.0.0.1, an actor placed on the worker by its resources.

Run as a script (``python ray_node.py start --address=127.0.0.1:PORT ...``): it imports only Ray.
"""

from __future__ import annotations

import sys

LOOPBACK = "127.0.0.1"


def main() -> None:
    """Run Ray's CLI with multi-node joins allowed and every node address kept on loopback."""
    from ray._private import ray_constants
    from ray._private import services as ray_services

    ray_constants.ENABLE_RAY_CLUSTER = True
    ray_services.get_node_ip_address = lambda address=None: LOOPBACK
    from ray.scripts.scripts import main as ray_main

    sys.argv = ["ray", *sys.argv[1:]]
    ray_main()


if __name__ == "__main__":
    main()
