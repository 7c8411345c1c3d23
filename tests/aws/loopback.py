"""Extra addresses on the loopback interface for one test (root and iproute2, as in CI): a multi-node job's
private addresses in the moto VPC of standins/ec2.py, so a node's TCP barrier really connects to its head."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager

import pytest


@contextmanager
def on_loopback(addrs: list[str]) -> Iterator[None]:
    """``addrs`` on the loopback interface for the duration (each must be new to this host)."""
    if os.geteuid() != 0 or not shutil.which("ip"):
        pytest.skip("adding the instances' private addresses to lo needs root and iproute2 (as in CI)")
    taken = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True, check=True).stdout
    added = []
    try:
        for addr in addrs:
            assert not addr.startswith("127.") and f" {addr}/" not in taken, f"{addr} is in use on this host"
            subprocess.run(["ip", "addr", "add", f"{addr}/32", "dev", "lo"], check=True)
            added.append(addr)
        yield
    finally:
        for addr in added:
            subprocess.run(["ip", "addr", "del", f"{addr}/32", "dev", "lo"], check=False)
