"""Pure, vectorized paired statistics for the gate: no I/O, no torch, no lm-eval.

sacrebleu is imported lazily, only for corpus metrics (bleu, chrf, ter); scipy lazily, only
for McNemar.
"""

from .aggregate import aggregate
from .multiplicity import adjust_pvalues, mde
from .paired import paired_test
from .result import PairedTest

__all__ = ["PairedTest", "adjust_pvalues", "aggregate", "mde", "paired_test"]
