"""``gatekeeper plan --mutants MODEL``: standard defects and harmless variants of a checkpoint.

An eval suite is only as good as the defects it catches. These are built from any Hugging Face
causal LM checkpoint (a local ``save_pretrained`` folder), deterministically (seeded), each
saved beside the others as its own checkpoint, so the suite runs on them as on any model:

defects (a gate should fail them)
- ``noise-1%``, ``noise-3%``, ``noise-10%``: Gaussian noise on every weight matrix, at that share
  of the matrix's own standard deviation;
- ``drop-layer``: the middle transformer block removed;
- ``norm-reset``: the final normalization's gain set to 1;
- ``embed-swap``: 16 pairs of token embedding rows swapped (among the 2,000 lowest ids);
- ``int4``: every weight matrix rounded to 4 bits (symmetric, per output row);

harmless variants (a gate should pass them)
- ``fp16-roundtrip``: every weight cast to float16 and back;
- ``batch-size``: the checkpoint itself, evaluated at another batch size (no new files).

torch and transformers are imported here only, when mutants are built.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gatekeeper.errors import GateError

SEED = 20261202
SWAPS = 16


@dataclass(frozen=True)
class Mutant:
    """One variant: its name, whether it is a defect, what was done; ``path`` None for a variant
    that is the checkpoint itself run differently (``batch_size``)."""

    name: str
    defect: bool
    what: str
    path: Path | None = None
    batch_size: int | None = None


def _matrices(model: Any) -> list[Any]:
    return [p for p in model.parameters() if p.dim() >= 2 and p.dtype.is_floating_point]


def _noise(scale: float) -> Callable[[Any], str]:
    def apply(model: Any) -> str:
        import torch

        gen = torch.Generator().manual_seed(SEED)
        with torch.no_grad():
            for p in _matrices(model):
                p.add_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * p.std() * scale)
        return f"Gaussian noise at {scale:.0%} of each weight matrix's standard deviation"
    return apply


def _blocks(model: Any) -> Any:
    """The model's list of transformer blocks (GPT-2, Llama/Mistral/Qwen, GPT-NeoX, OPT, Phi)."""
    for path in ("transformer.h", "model.layers", "gpt_neox.layers", "model.decoder.layers", "transformer.blocks"):
        obj = model
        for part in path.split("."):
            obj = getattr(obj, part, None)
            if obj is None:
                break
        if obj is not None and hasattr(obj, "__delitem__") and len(obj) > 1:
            return obj
    raise GateError(f"{type(model).__name__}: no list of transformer blocks found (expected transformer.h or "
                    "model.layers); drop-layer cannot be built")


def _drop_layer(model: Any) -> str:
    blocks = _blocks(model)
    middle = len(blocks) // 2
    del blocks[middle]
    for i, block in enumerate(blocks):  # the KV cache indexes layers: renumber what follows
        for m in block.modules():
            if hasattr(m, "layer_idx"):
                m.layer_idx = i
    for attr in ("num_hidden_layers", "n_layer", "num_layers"):
        if hasattr(model.config, attr) and isinstance(getattr(model.config, attr), int):
            setattr(model.config, attr, len(blocks))
    return f"block {middle} of {len(blocks) + 1} removed"


def _final_norm(model: Any) -> Any:
    for path in ("transformer.ln_f", "model.norm", "gpt_neox.final_layer_norm", "model.decoder.final_layer_norm",
                 "model.final_layernorm"):
        obj = model
        for part in path.split("."):
            obj = getattr(obj, part, None)
            if obj is None:
                break
        if obj is not None and getattr(obj, "weight", None) is not None:
            return obj
    raise GateError(f"{type(model).__name__}: no final normalization found (expected transformer.ln_f or "
                    "model.norm); norm-reset cannot be built")


def _norm_reset(model: Any) -> str:
    import torch

    norm = _final_norm(model)
    with torch.no_grad():
        norm.weight.fill_(1.0)
    return "final normalization gain set to 1"


def _embed_swap(model: Any) -> str:
    import torch

    emb = model.get_input_embeddings().weight
    rows = min(emb.shape[0], 2000)
    gen = torch.Generator().manual_seed(SEED)
    pick = torch.randperm(rows, generator=gen)[: 2 * SWAPS]
    a, b = pick[:SWAPS], pick[SWAPS:]
    with torch.no_grad():
        saved = emb[a].clone()
        emb[a] = emb[b]
        emb[b] = saved
    return f"{SWAPS} pairs of embedding rows swapped"


def _int4(model: Any) -> str:
    import torch

    with torch.no_grad():
        for p in _matrices(model):
            flat = p.reshape(p.shape[0], -1)
            scale = flat.abs().amax(dim=1, keepdim=True).clamp_min(1e-12) / 7.0
            flat.copy_(torch.clamp(torch.round(flat / scale), -8, 7) * scale)
    return "weight matrices rounded to 4 bits (symmetric, per row)"


def _fp16(model: Any) -> str:
    import torch

    with torch.no_grad():
        for p in model.parameters():
            if p.dtype.is_floating_point:
                p.copy_(p.to(torch.float16).to(p.dtype))
    return "weights cast to float16 and back"


BUILDERS: dict[str, tuple[bool, Callable[[Any], str]]] = {
    "noise-1%": (True, _noise(0.01)),
    "noise-3%": (True, _noise(0.03)),
    "noise-10%": (True, _noise(0.10)),
    "drop-layer": (True, _drop_layer),
    "norm-reset": (True, _norm_reset),
    "embed-swap": (True, _embed_swap),
    "int4": (True, _int4),
    "fp16-roundtrip": (False, _fp16),
}


def check_model(model_dir: Path) -> Path:
    model_dir = Path(model_dir)
    if not (model_dir / "config.json").is_file():
        raise GateError(f"{model_dir}: --mutants takes a local checkpoint folder (save_pretrained, with config.json)")
    return model_dir


def make(model_dir: Path, name: str, target: Path) -> Mutant:
    """Build the variant ``name`` (a key of ``BUILDERS``) of the checkpoint at ``model_dir`` and
    save it as a checkpoint folder at ``target`` (replaced if there)."""
    import torch
    from transformers import AutoModelForCausalLM

    defect, apply = BUILDERS[name]
    torch.manual_seed(SEED)
    model = AutoModelForCausalLM.from_pretrained(check_model(model_dir), dtype=torch.float32)
    what = apply(model)
    if target.exists():
        shutil.rmtree(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(target, safe_serialization=True)
    for f in Path(model_dir).iterdir():  # tokenizer and the rest, as they were
        if f.is_file() and not (target / f.name).exists() and not f.name.endswith((".safetensors", ".bin")):
            shutil.copy2(f, target / f.name)
    return Mutant(name, defect, what, target)


def other_batch_size(batch_size: Any) -> Mutant:
    """The harmless variant that is the checkpoint itself at another batch size than ``batch_size``."""
    other = 1 if batch_size != 1 else 2
    return Mutant("batch-size", False, f"the checkpoint itself at batch size {other} (the suite's: {batch_size})",
                  None, other)
