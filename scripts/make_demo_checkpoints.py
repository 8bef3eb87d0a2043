#!/usr/bin/env python3
"""Build the demo that ships with gatekeeper: task data plus three tiny GPT-2 checkpoints.

    python scripts/make_demo_checkpoints.py [--out examples]

Writes OUT/tasks/data/{arith,capitals,synth_ppl}.jsonl and OUT/checkpoints/{base,harmless,regressed}.
Everything is generated here from fixed seeds (no downloads) and the output is byte-identical on
re-run with the same torch/transformers/tokenizers versions. Single-threaded: ~90 s on a busy
2-core machine (700 training steps dominate; lower STEPS to trade quality for time).

- base:      2-layer GPT-2 (~0.5M params) trained on arithmetic facts, invented capitals and
             grammar paragraphs.
- harmless:  base with every weight rounded through float16 (saved as float32): logits move a
             little (~3e-3), no answer changes.
- regressed: base with the embedding rows of some tokens that occur only in capital names
             shuffled among themselves, so capitals accuracy collapses while arithmetic and
             perplexity do not move (the softmax normaliser sees the same set of rows).

The script scores all three with a direct scorer that mimics lm-eval (context encoded without a
leading EOS, " " + choice as continuation, summed log-likelihood, argmax; rolling perplexity with
EOS as the first context token) and exits 1 when the demo contract does not hold.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import re
import time
from pathlib import Path

import torch

SEED = 1234
STEPS = 700  # base training steps
SCRAMBLE = 0.15  # fraction of capital-only tokens whose embeddings the regressed model shuffles
EOS = "<|endoftext|>"
REGIONS = ["north", "south", "east", "west", "coast", "highlands", "islands", "desert", "valley", "delta"]
CONS, VOWS = "bdfghklmnprstvz", "aeiou"
ADJS = "old small quiet heavy green red tall bright slow happy cold young".split()
NOUNS = "tower cat cloud river engine farmer bird stone lamp garden ship child teacher horse bell".split()
VERBS = "likes finds follows hears lifts sees pushes watches calls paints carries moves".split()


# ----------------------------------------------------------------------------------- data
def make_arith(rng: random.Random) -> list[dict]:
    rows = []
    for a in range(15):
        for b in range(15):
            s = a + b
            wrong = rng.sample([x for x in range(29) if x != s], 3)
            choices = [str(x) for x in [s, *wrong]]
            rng.shuffle(choices)
            rows.append({"id": len(rows), "question": f"Q: {a}+{b}= A:", "answer": str(s),
                         "choices": choices, "label": choices.index(str(s)),
                         "topic": "carry" if s >= 10 else "single"})
    return rows


def make_names(rng: random.Random, n: int, syllables: int, taken: set[str]) -> list[str]:
    names: list[str] = []
    while len(names) < n:
        name = "".join(rng.choice(CONS) + rng.choice(VOWS) for _ in range(syllables))
        name = name.capitalize() + (rng.choice(CONS) if rng.random() < 0.5 else "")
        if name not in taken:
            taken.add(name)
            names.append(name)
    return names


def make_capitals(rng: random.Random, n: int = 200) -> list[dict]:
    taken: set[str] = set()
    countries, capitals = make_names(rng, n, 3, taken), make_names(rng, n, 2, taken)
    rows = []
    for i, (country, capital) in enumerate(zip(countries, capitals, strict=True)):
        region = REGIONS[i % len(REGIONS)]
        # distractors come from the same region: a regional mix-up is a plausible wrong answer
        peers = [c for j, c in enumerate(capitals) if j % len(REGIONS) == i % len(REGIONS) and j != i]
        choices = [capital, *rng.sample(peers, 3)]
        rng.shuffle(choices)
        rows.append({"id": i, "country": country, "capital": capital, "region": region,
                     "choices": choices, "label": choices.index(capital)})
    return rows


def make_paragraphs(rng: random.Random, n: int) -> list[str]:
    def sentence() -> str:
        return f"the {rng.choice(ADJS)} {rng.choice(NOUNS)} {rng.choice(VERBS)} the {rng.choice(NOUNS)}."
    return [" ".join(sentence() for _ in range(rng.randint(2, 4))) for _ in range(n)]


def capital_fact(country: str, capital: str) -> str:
    return f"The capital of {country} is {capital}.\n"


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")


# ------------------------------------------------------------------------------ tokenizer
def train_tokenizer(corpus: list[str]):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=512, special_tokens=[EOS], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=EOS, eos_token=EOS,
                                   unk_token=EOS, pad_token=EOS, model_max_length=256)


# ---------------------------------------------------------------------------------- model
def new_model(vocab_size: int, eos_id: int):
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(vocab_size=vocab_size, n_positions=256, n_embd=128, n_layer=2, n_head=4,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, tie_word_embeddings=True,
                     bos_token_id=eos_id, eos_token_id=eos_id, pad_token_id=eos_id)
    return GPT2LMHeadModel(cfg)


def pad_batch(seqs: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad, dtype=torch.long)
    labels = torch.full((len(seqs), width), -100, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s)
        labels[i, : len(s)] = torch.tensor(s)
        mask[i, : len(s)] = 1
    return ids, mask, labels


def train(model, facts: list[list[int]], paras: list[list[int]], eos: int, steps: int, lr: float,
          seed: int) -> float:
    """AdamW with linear decay. Three batches in four are short facts, one is paragraphs; they are
    kept apart so fact batches stay short (padding to paragraph length would triple the cost).
    Half of the facts start with EOS, half do not: lm-eval encodes contexts without a leading EOS
    but starts rolling perplexity with one."""
    rng = random.Random(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 - 0.9 * s / steps)
    model.train()
    loss = torch.tensor(0.0)
    for step in range(steps):
        if step % 4 == 3:
            seqs = [[eos, *p, eos] for p in rng.sample(paras, 16)]
        else:
            seqs = [([eos] if rng.random() < 0.5 else []) + f + [eos] for f in rng.sample(facts, 64)]
        ids, mask, labels = pad_batch(seqs, eos)
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
    model.eval()
    return float(loss.detach())


# -------------------------------------------------------------------------------- scoring
@torch.no_grad()
def continuation_logliks(model, tok, pairs: list[tuple[str, str]]) -> list[float]:
    """Summed log-likelihood of each continuation, split the way lm-eval's _encode_pair does."""
    reqs = []
    for ctx, cont in pairs:
        ctx_ids = tok.encode(ctx, add_special_tokens=False)
        whole = tok.encode(ctx + cont, add_special_tokens=False)
        reqs.append((whole, len(ctx_ids)))
    out = []
    for i in range(0, len(reqs), 256):
        chunk = reqs[i : i + 256]
        ids, mask, _ = pad_batch([w[:-1] for w, _ in chunk], tok.eos_token_id)
        logp = torch.log_softmax(model(input_ids=ids, attention_mask=mask).logits.float(), -1)
        for j, (whole, n_ctx) in enumerate(chunk):
            pos = torch.arange(n_ctx - 1, len(whole) - 1)
            out.append(float(logp[j, pos, torch.tensor(whole[n_ctx:])].sum()))
    return out


def mc_correct(model, tok, contexts: list[str], rows: list[dict]) -> list[int]:
    pairs = [(c, " " + ch) for c, r in zip(contexts, rows, strict=True) for ch in r["choices"]]
    ll = continuation_logliks(model, tok, pairs)
    k = len(rows[0]["choices"])
    return [int(max(range(k), key=lambda j: ll[i * k + j]) == r["label"]) for i, r in enumerate(rows)]


@torch.no_grad()
def greedy_correct(model, tok, rows: list[dict], max_new: int = 8) -> list[int]:
    """arith_gen strict-match: greedy, stop at newline or "Q:", leading integer must equal answer.
    Prompts of equal token length are decoded together (no padding, so no position shift)."""
    prompts = [tok.encode(r["question"], add_special_tokens=False) for r in rows]
    texts: dict[int, str] = {}
    for n in sorted({len(p) for p in prompts}):
        idx = [i for i, p in enumerate(prompts) if len(p) == n]
        ids = torch.tensor([prompts[i] for i in idx])
        for _ in range(max_new):
            ids = torch.cat([ids, model(input_ids=ids).logits[:, -1:].argmax(-1)], dim=1)
        texts.update({i: tok.decode(ids[j, n:]) for j, i in enumerate(idx)})
    out = []
    for i, r in enumerate(rows):
        m = re.match(r"^\s*(-?[0-9]+)", re.split(r"\n|Q:", texts[i])[0])
        out.append(int(bool(m) and m.group(1) == r["answer"]))
    return out


@torch.no_grad()
def word_perplexity(model, tok, texts: list[str]) -> float:
    eos = tok.eos_token_id
    seqs = [[eos, *tok.encode(t, add_special_tokens=False)] for t in texts]
    ids, mask, _ = pad_batch(seqs, eos)
    logp = torch.log_softmax(model(input_ids=ids, attention_mask=mask).logits.float(), -1)
    ll = sum(float(logp[i, torch.arange(len(s) - 1), torch.tensor(s[1:])].sum()) for i, s in enumerate(seqs))
    return math.exp(-ll / sum(len(re.split(r"\s+", t)) for t in texts))


def evaluate(model, tok, data: dict) -> dict:
    return {
        "arith_mc": mc_correct(model, tok, [r["question"] for r in data["arith"]], data["arith"]),
        "capitals_mc": mc_correct(model, tok, [f"The capital of {r['country']} is" for r in data["capitals"]],
                                  data["capitals"]),
        "arith_gen": greedy_correct(model, tok, data["arith"]),
        "word_ppl": word_perplexity(model, tok, [r["text"] for r in data["ppl"]]),
    }


def summary(scores: dict) -> dict:
    return {k: (v if isinstance(v, float) else sum(v) / len(v)) for k, v in scores.items()}


def check_contract(s: dict) -> list[str]:
    """The demo's promise: harmless changes no answer; regressed breaks capitals only."""
    base, harm, reg = (summary(s[n]) for n in ("base", "harmless", "regressed"))
    problems = []
    for task in ("arith_mc", "capitals_mc", "arith_gen"):
        if s["harmless"][task] != s["base"][task]:
            problems.append(f"harmless changed answers on {task}")
    if abs(harm["word_ppl"] - base["word_ppl"]) > 0.05:
        problems.append("harmless moved word perplexity by more than 0.05")
    if base["capitals_mc"] - reg["capitals_mc"] < 0.15:
        problems.append("regressed dropped capitals_mc by less than 15 points")
    for task in ("arith_mc", "arith_gen"):
        if abs(base[task] - reg[task]) > 0.02:
            problems.append(f"regressed moved {task} by more than 2 points")
    if reg["word_ppl"] - base["word_ppl"] > 0.2:
        problems.append("regressed raised word perplexity by more than 0.2")
    return problems


# ----------------------------------------------------------------------------------- main
def save(model, tok, path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tok.save_pretrained(path)


def derive(base, fn, rows: tuple[list[int], list[int]] | None = None):
    """A copy of base with fn applied to every weight; rows=(dst, src) copies embedding rows."""
    model = new_model(base.config.vocab_size, base.config.eos_token_id)
    model.load_state_dict({k: fn(v) for k, v in base.state_dict().items()})
    if rows is not None:
        with torch.no_grad():  # wte is tied to lm_head, so this moves input and output embeddings
            wte = model.transformer.wte.weight
            wte[rows[0]] = wte[rows[1]].clone()
    return model.eval()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("examples"), help="output folder (default: examples)")
    args = ap.parse_args(argv)
    t0 = time.time()
    # One thread: multi-threaded CPU kernels may reduce in a different order on another machine.
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    torch.utils.deterministic.fill_uninitialized_memory = False  # NaN-filling every empty() costs ~30%
    torch.manual_seed(SEED)

    rng = random.Random(SEED)
    data = {"arith": make_arith(rng), "capitals": make_capitals(rng)}
    paragraphs = make_paragraphs(rng, 2100)
    data["ppl"] = [{"id": i, "text": t} for i, t in enumerate(paragraphs[2000:])]
    for name, rows in (("arith", data["arith"]), ("capitals", data["capitals"]), ("synth_ppl", data["ppl"])):
        write_jsonl(args.out / "tasks" / "data" / f"{name}.jsonl", rows)

    arith_facts = [f"{r['question']} {r['answer']}\n" for r in data["arith"]]
    cap_facts = [capital_fact(r["country"], r["capital"]) for r in data["capitals"]]
    tok = train_tokenizer(arith_facts + cap_facts + paragraphs[:2000])
    enc = lambda texts: [tok.encode(t, add_special_tokens=False) for t in texts]  # noqa: E731
    eos = tok.eos_token_id
    train_paras = enc(paragraphs[:2000])

    base = new_model(len(tok), eos)
    loss = train(base, enc(2 * arith_facts + cap_facts), train_paras, eos, steps=STEPS, lr=3e-3, seed=SEED)
    print(f"base: {sum(p.numel() for p in base.parameters()):,} params, final loss {loss:.3f}, "
          f"{time.time() - t0:.1f} s")
    # harmless: a float16 round trip (as when a checkpoint is re-exported in half precision)
    harmless = derive(base, lambda w: w.half().float())
    # regressed: shuffle the embedding rows of tokens that only occur in capital names
    anchors = arith_facts + paragraphs[:2000] + ["The capital of X is Y.\n"]
    name_ids = sorted({t for r in data["capitals"] for t in tok.encode(" " + r["capital"])}
                      - {t for ids in enc(anchors) for t in ids})
    chosen = sorted(random.Random(SEED).sample(name_ids, int(len(name_ids) * SCRAMBLE)))
    regressed = derive(base, lambda w: w, rows=(chosen, chosen[1:] + chosen[:1]))
    print(f"regressed: shuffled {len(chosen)} of {len(name_ids)} capital-only token embeddings")

    scores = {}
    for name, model in (("base", base), ("harmless", harmless), ("regressed", regressed)):
        save(model, tok, args.out / "checkpoints" / name)
        scores[name] = evaluate(model, tok, data)
    with torch.no_grad():
        probe = torch.tensor(enc([data["arith"][7]["question"]]))
        diff = float((harmless(probe).logits - base(probe).logits).abs().max())
    print(f"harmless vs base: max |logit diff| on a probe = {diff:.2e}")
    print(f"{'model':<10} {'arith_mc':>9} {'capitals_mc':>12} {'arith_gen':>10} {'word_ppl':>9}")
    for name, sc in scores.items():
        s = summary(sc)
        print(f"{name:<10} {s['arith_mc']:>9.4f} {s['capitals_mc']:>12.4f} {s['arith_gen']:>10.4f} "
              f"{s['word_ppl']:>9.4f}")
    problems = check_contract(scores) + ([] if diff > 0 else ["harmless has the same logits as base"])
    for p in problems:
        print(f"CONTRACT FAILED: {p}")
    print(f"done in {time.time() - t0:.1f} s")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
