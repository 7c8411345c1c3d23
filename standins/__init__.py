"""Stand-ins for the real markets, used by the tests and by bench/, never by the product.

- ``standins.vastapi``: a local Vast.ai API (aiohttp on loopback, the real endpoints' shapes, containers run as
  local processes) over a deterministic market of offers; ``python -m standins.vastapi.server`` runs it alone.
- ``standins.ec2``: moto stores user data and runs none: this runs the boot script Lockstep generated as an EC2
  instance would (``Node``), and an instance metadata service (IMDSv2) on loopback (``FakeImds``).
- ``standins.faults``: a proxy on loopback in front of a market's API that fails a seeded fraction of the
  requests (503, 500, a dropped connection, an answer lost after the market acted): bench/leaks.py --faults.
- ``standins.memory``: an in-memory market implementing the provider interface, for the router's, the
  lifecycle's and reconciliation's own logic, and for benchmarks that must not wait on a market.

They live outside tests/ so that bench/ can use them without importing the test suite (bench/ imports nothing
from tests/), and outside the three packages so that they never ship: broker/, providers/ and policies/ must
not import this package, and it imports nothing from tests/ (tests/test_architecture.py checks all three).
It is not in the wheel (pyproject.toml's packages); an editable install or a checkout finds it at the root.
"""
