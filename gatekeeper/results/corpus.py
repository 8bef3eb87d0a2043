"""Corpus metrics (bleu, chrf, ter) through sacrebleu's own per-sentence statistics.

lm-eval 0.4.13 scores these with ``sacrebleu.corpus_bleu/corpus_chrf/corpus_ter(preds, refs)``
with default settings, after ``_sacreformat``. sacrebleu itself computes a corpus score by
summing per-sentence statistics and applying a formula, so we extract those statistics once
(the slow part: tokenization, n-grams, edit distance) and recompute the formula, vectorized,
on every resample. ``sentence_stats`` + ``SCORE_FNS`` reproduce ``corpus_*().score`` (tested).
sacrebleu is imported lazily: the gate must run without it unless a corpus metric is gated.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

CORPUS_AGGREGATIONS = ("bleu", "chrf", "chrf++", "ter")


def _is_non_str_iterable(obj: Any) -> bool:
    return isinstance(obj, Iterable) and not isinstance(obj, str)


def sacreformat(refs: list[Any], preds: list[Any]) -> tuple[list[Any], list[str]]:
    """A copy of ``lm_eval.api.metrics._sacreformat`` (0.4.13), so lm-eval need not be installed.

    refs become a list of reference streams (one tuple per reference position), preds a list
    of strings. Note ``zip`` truncates items with more references to the smallest count, as
    lm-eval does.
    """
    if not _is_non_str_iterable(refs):
        refs = list(refs)
    if not _is_non_str_iterable(refs[0]):
        refs = [[ref] for ref in refs]
    refs = list(zip(*refs, strict=False))  # lm-eval truncates too
    if not _is_non_str_iterable(preds):
        preds = list(preds)
    if _is_non_str_iterable(preds[0]):
        if len(preds[0]) != 1:
            raise ValueError(f"corpus prediction must be a string, got {preds[0]!r}")
        preds = [pred[0] for pred in preds]
    return refs, preds


def _metric(aggregation: str) -> Any:
    """A sacrebleu metric object configured exactly as sacrebleu's ``corpus_*`` functions do
    with their default arguments (what lm-eval calls)."""
    try:
        from sacrebleu.metrics import BLEU, CHRF, TER
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ValueError(f"corpus metric {aggregation!r} needs sacrebleu (pip install sacrebleu)") from err
    if aggregation == "bleu":
        return BLEU(lowercase=False, force=False, tokenize=BLEU.TOKENIZER_DEFAULT, smooth_method="exp",
                    smooth_value=None, effective_order=False)
    if aggregation in ("chrf", "chrf++"):  # chrf++: corpus_chrf(..., word_order=2), as lm-eval calls it
        return CHRF(char_order=CHRF.CHAR_ORDER, word_order=2 if aggregation == "chrf++" else CHRF.WORD_ORDER,
                    beta=CHRF.BETA, whitespace=False, eps_smoothing=False)
    if aggregation == "ter":
        return TER(normalized=False, no_punct=False, asian_support=False, case_sensitive=False)
    raise ValueError(f"unknown corpus aggregation {aggregation!r}")


def corpus_score(aggregation: str, values: np.ndarray) -> float:
    """lm-eval's ``bleu``/``chrf``/``ter`` aggregation of [reference, prediction] rows."""
    import sacrebleu

    refs, preds = sacreformat(list(values[:, 0]), list(values[:, 1]))
    if aggregation == "chrf++":
        return float(sacrebleu.corpus_chrf(preds, refs, word_order=2).score)
    fn = {"bleu": sacrebleu.corpus_bleu, "chrf": sacrebleu.corpus_chrf, "ter": sacrebleu.corpus_ter}
    return float(fn[aggregation](preds, refs).score)


def sentence_stats(aggregation: str, values: np.ndarray) -> np.ndarray:
    """Per-item sacrebleu statistics, float64 (n, k): bleu k=10 [sys_len, ref_len, correct1-4,
    total1-4]; chrf k=18 [hyp, ref, match] x 6 char orders (chrf++ k=24: + 2 word orders); ter k=2 [edits, ref_len]."""
    refs, preds = sacreformat(list(values[:, 0]), list(values[:, 1]))
    metric = _metric(aggregation)
    metric._check_corpus_score_args(preds, refs)
    stats = metric._extract_corpus_statistics(preds, refs)
    return np.asarray(stats, dtype=np.float64)


def exact_score_from_stats(aggregation: str, stats: np.ndarray) -> float:
    """sacrebleu's own formula on summed statistics: equals ``corpus_*().score``."""
    metric = _metric(aggregation)
    total = stats.sum(axis=0)
    as_int = aggregation != "ter"  # bleu/chrf statistics are integer counts in sacrebleu
    row = [int(round(v)) for v in total] if as_int else [float(v) for v in total]
    return float(metric._compute_score_from_stats(row).score)


def bleu_score(s: np.ndarray) -> np.ndarray:
    """sacrebleu BLEU (4-gram, 'exp' smoothing, no effective order) on summed stats (R, 10)."""
    sys_len, ref_len = s[:, 0], s[:, 1]
    correct, total = s[:, 2:6], s[:, 6:10]
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        bp = np.where(sys_len < ref_len, np.where(sys_len > 0, np.exp(1 - ref_len / sys_len), 0.0), 1.0)
        zero = correct == 0
        smooth = 2.0 ** np.cumsum(zero, axis=1)  # 'exp' smoothing doubles per zero-match order
        prec = np.where(zero, 100.0 / (smooth * total), 100.0 * correct / total)
        logs = np.log(prec)
        score = bp * np.exp(logs.sum(axis=1) / 4)
    # sacrebleu returns 0 when nothing matches, and (via log(0) -> -1e10) when an order has
    # no n-grams at all.
    dead = ~(correct > 0).any(axis=1) | (total == 0).any(axis=1)
    return np.where(dead, 0.0, score)


def chrf_score(s: np.ndarray) -> np.ndarray:
    """sacrebleu chrF (char order 6, beta 2, effective-order averaging) on summed stats (R, 18)."""
    eps, factor = 1e-16, 4.0
    n_hyp, n_ref, n_match = s[:, 0::3], s[:, 1::3], s[:, 2::3]
    with np.errstate(divide="ignore", invalid="ignore"):
        prec = np.where(n_hyp > 0, n_match / n_hyp, eps)
        rec = np.where(n_ref > 0, n_match / n_ref, eps)
        effective = (n_hyp > 0) & (n_ref > 0)
        n_eff = effective.sum(axis=1)
        avg_prec = np.where(n_eff > 0, np.where(effective, prec, 0).sum(axis=1) / n_eff, 0.0)
        avg_rec = np.where(n_eff > 0, np.where(effective, rec, 0).sum(axis=1) / n_eff, 0.0)
        score = 100 * (1 + factor) * avg_prec * avg_rec / (factor * avg_prec + avg_rec)
    return np.where(avg_prec + avg_rec > 0, score, 0.0)


def ter_score(s: np.ndarray) -> np.ndarray:
    """sacrebleu TER on summed stats (R, 2): 100 * edits / reference length."""
    edits, ref_len = s[:, 0], s[:, 1]
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(ref_len > 0, edits / ref_len, np.where(edits > 0, 1.0, 0.0))
    return 100 * ratio


SCORE_FNS = {"bleu": bleu_score, "chrf": chrf_score, "chrf++": chrf_score, "ter": ter_score}
