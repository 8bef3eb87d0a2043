"""Stage: results. Per-item values, keyed by (task, filter, metric, doc_id), with their hashes.

- ``metrics``: the registry of metric kinds, the vocabulary every later stage speaks: how a
  kind's per-item values are read, validated, stored, aggregated exactly as lm-eval does, and
  resampled; ``corpus``: sacrebleu's sufficient statistics for bleu/chrf/ter;
- ``trusted``: task-defined (``!function``) aggregations, from trusted task code only;
- ``layout``, ``reader``, ``samples``, ``snippets``: lm-eval's output folder read into a
  ``model.RunResults``, every aggregate recomputed and checked.

May import: the ground floor only (model, errors, files, yamlsafe, text). It sits below the
suite stage because the suite's names are checked against the kinds this stage defines.
"""
