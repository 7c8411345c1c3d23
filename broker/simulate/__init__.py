"""Trace-driven simulation: the broker's own pure policies replayed over recorded traces.

- :mod:`broker.simulate.traces` reads spot availability traces and GPU cluster pod traces.
- :mod:`broker.simulate.deadline` runs one deadline job on spot / on-demand (the setting of
  *Can't Be Late*, NSDI'24) under a policy, and computes the exact omniscient optimum.
- :mod:`broker.simulate.cluster` replays a GPU job trace against an on-prem pool that can burst
  to the cloud.

The ``lockstep`` policy in both calls the same functions the live broker calls
(``policies.placement``), at the same decision points; see docs/simulation.md.
"""
