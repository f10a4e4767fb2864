"""Capacity planning: load as a request rate, and the cheapest deployment that serves it.

- what a plan serves per second (Little's law on the closed loop) and the concurrency a
  rate needs are the cost model's (:mod:`shardlab.costmodel.rate`);
- :mod:`shardlab.sizing.capacity`: the proven capacity of one instance of each shape,
  aggregated or one pool of disaggregated serving, and its ceiling from CP-SAT's bounds;
- :mod:`shardlab.sizing.reach`: the most any deployment serves at those ceilings (a
  rate past it refused before any solve);
- :mod:`shardlab.sizing.cover`: the fewest-cost multiset of instances covering a rate,
  exact;
- :mod:`shardlab.sizing.size`: ``shardlab size``: over GPU types, shapes and serving
  modes, with the proof's argument (:mod:`shardlab.sizing.deployment`: what it answers);
- :mod:`shardlab.sizing.inputs` (rates, prices as written) and
  :mod:`shardlab.sizing.answer` (the JSON answer; :mod:`shardlab.launch.sized` reads it back);
- :mod:`shardlab.sizing.suite`: the sizing suite of ``shardlab compare --suite sizing``.
"""
