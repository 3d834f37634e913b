"""`rollserve demo`: the simulated robot driven by the served reference policy, one table per strategy.

The pieces, one job each: ``netdelay`` (a loopback proxy that adds network delay), ``strategies``
(synchronous, asynchronous, asynchronous with RTC, on the shared inference loop), ``robot`` (the
real-time control loop), ``simtime`` (the same loop in simulated time, for the delay sweep),
``recording`` (every request's timings), ``metrics``, ``progress``, ``report``, ``plots``,
``video`` and ``runner`` (the CLI).
"""
