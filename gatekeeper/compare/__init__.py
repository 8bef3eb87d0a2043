"""Stage: compare. Pure statistics on two ``RunResults``: pair, test, correct, decide.

- ``compat``: every comparability check (run vs run, and run or baseline vs the suite);
- ``compare``: per (task, filter, metric) paired test, margins, multiplicity correction,
  verdicts, MDE → ``Outcome``;
- ``stats/``: vectorized paired tests, intervals, corrections; no I/O.

May import: the ground floor, ``results`` and ``suite``.
"""
