"""Stage: suite. What is measured and how it is judged.

- ``suite``: the pinned suite file (schema, defaults, canonical hash) and policy files;
- ``policy``: margins, alpha, correction, rules (``Policy.lookup``);
- ``names``: every task/filter/metric the suite names matches something the run produces;
- ``policydiff``: what a pull request changes in the policy, for the reviewer;
- ``schemas/suite.schema.json``.

May import: the ground floor and ``results`` (the metric-kind registry names are checked against).
"""
