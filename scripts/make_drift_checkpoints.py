#!/usr/bin/env python3
"""A nightly sequence of demo checkpoints that each lose a little: the slow drift an anchor catches.

    python scripts/make_drift_checkpoints.py --out DIR [--nights 6] [--step 0.1] [--tokens 8] [--score]

Night k is examples/checkpoints/base with the embedding rows of ``--tokens`` of its capital-only
tokens (tokens of capital names that occur in no arithmetic question, no perplexity text and not
in the prompt's own words, as the demo's regressed checkpoint chooses them) moved ``k * step`` of
the way towards the next one's row: every night loses what the night before lost, and a little
more. Arithmetic and perplexity do not move (their tokens are untouched). Each night is a few
capital answers worse than the one before (within the demo suite's 2-point margin night over
night) while the loss since the base grows past it.

Deterministic (fixed seed, no training): the same DIR on every machine with the same torch.
With --score, prints each night's capitals accuracy from the demo's own scorer (scripts/make_demo_checkpoints.py).
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BASE = ROOT / "examples" / "checkpoints" / "base"
DATA = ROOT / "examples" / "tasks" / "data"
SEED = 4321


def _rows(name: str) -> list[dict]:
    return [json.loads(line) for line in (DATA / f"{name}.jsonl").read_text(encoding="utf-8").splitlines() if line]


def capital_only_tokens(tok, capitals: list[dict], arith: list[dict], ppl: list[dict]) -> list[int]:
    """Token ids that occur in a capital's name and nowhere else the demo suite reads."""
    names = {t for r in capitals for t in tok.encode(" " + r["capital"], add_special_tokens=False)}
    other = ["The capital of X is Y.\n"] + [r["text"] for r in ppl]
    other += [f"{r['question']} {' '.join(r['choices'])} {r['answer']}" for r in arith]
    used = {t for text in other for t in tok.encode(text, add_special_tokens=False)}
    return sorted(names - used)


def build(out: Path, nights: int, step: float, tokens: int = 8) -> list[Path]:
    import torch
    from transformers import AutoTokenizer, GPT2LMHeadModel

    torch.manual_seed(SEED)
    tok = AutoTokenizer.from_pretrained(BASE)
    ids = capital_only_tokens(tok, _rows("capitals"), _rows("arith"), _rows("synth_ppl"))
    order = ids[:]
    random.Random(SEED).shuffle(order)
    written = []
    chosen = order[:tokens]
    for night in range(1, nights + 1):
        share = min(1.0, step * night)
        model = GPT2LMHeadModel.from_pretrained(BASE).eval()
        with torch.no_grad():  # wte is tied to lm_head: input and output embeddings move together
            wte = model.transformer.wte.weight
            wte[chosen] = (1 - share) * wte[chosen] + share * wte[chosen[1:] + chosen[:1]]
        dest = out / f"night{night}"
        if dest.exists():
            shutil.rmtree(dest)
        model.save_pretrained(dest)
        tok.save_pretrained(dest)
        written.append(dest)
        print(f"night{night}: {len(chosen)} of {len(ids)} capital-only token embeddings moved {share:.0%} -> {dest}")
    return written


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="folder for night1 ... nightN")
    ap.add_argument("--nights", type=int, default=6)
    ap.add_argument("--tokens", type=int, default=8, help="capital-only tokens that drift")
    ap.add_argument("--step", type=float, default=0.1, help="how much further they move each night")
    ap.add_argument("--score", action="store_true", help="print each night's capitals accuracy (demo scorer)")
    args = ap.parse_args(argv)
    paths = build(args.out, args.nights, args.step, args.tokens)
    if args.score:
        sys.path.insert(0, str(ROOT / "scripts"))
        from make_demo_checkpoints import mc_correct
        from transformers import AutoTokenizer, GPT2LMHeadModel

        caps = _rows("capitals")
        prompts = [f"The capital of {r['country']} is" for r in caps]
        for p in [BASE, *paths]:
            model, tok = GPT2LMHeadModel.from_pretrained(p).eval(), AutoTokenizer.from_pretrained(p)
            right = mc_correct(model, tok, prompts, caps)
            print(f"{p.name}: capitals acc {sum(right) / len(right):.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
