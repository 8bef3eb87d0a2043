"""Stage: baseline. The accepted reference, beside the results.

- ``format`` / ``validate``: the baseline file (gzip JSON, checksummed, every field checked);
- ``store``: save, load, record, promote (history, folder lock), show; ``load_any``;
- ``gitbase`` / ``prbase``: files as they are at a pull request's base commit.

May import: the ground floor, ``results``, ``suite`` and ``compare`` (comparability checks).
"""
