"""Audit the inference cache of every decoder model type: what perfguide prices for the cache ``generate`` leaves
against the tensors the real cache holds.

Run: ``HF_HUB_OFFLINE=1 nice .venv/bin/python bench/kv_audit.py [--only TYPE ...]``; prints each row and writes
bench/results/kv_audit.md. For every model type in transformers' causal-LM mapping, the family audit's tiny config
(bench/family_audit.py ``tiny_config``: hidden 128, 8 heads of 16, 2 KV heads, 4 experts top-2, the class's own
sliding windows and layer kinds) builds a real fp32 model on CPU; ``generate`` runs greedy on 2 prompts of 20 tokens
for 5 new ones. Real: the bytes of every tensor the returned cache holds (keys and values once each where they share
storage, the recurrent and convolution states, compressed and indexer entries). Priced: ``memory.inference.kv_cache_bytes``
of the ModelSpec read from the same config at the positions ``cached_tokens`` counts. A ratio far from 1 is a cache
perfguide does not know; a type that fails to build or generate is listed with the reason.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "scripts"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from family_audit import tiny_config

from perfguide.memory.inference import cached_tokens, kv_cache_bytes
from perfguide.model.types import ModelSpec
from perfguide.setup import Setup

OUT = ROOT / "bench" / "results" / "kv_audit.md"
BATCH, PROMPT, NEW = 2, 20, 5
MAX_PARAMS = 50_000_000
#: attributes of a cache layer that hold tensors or dicts of tensors (transformers 5.24 cache_utils and the model
#: files' own layer classes: DeepSeek-V4's compressor entries, Qwen3-Next's and Mamba's states)
TENSOR_ATTRS = ("keys", "values", "conv_states", "recurrent_states", "compressed_kv", "buffer_kv", "buffer_gate",
                "overlap_kv", "overlap_gate", "indexer_keys")


def _tensors(value: Any) -> list[Any]:
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v)]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    return [value] if hasattr(value, "untyped_storage") else []


def cache_bytes(cache: Any) -> int:
    """Bytes of the distinct storages a cache holds: DeepSeek-V4's values are its keys, GPT-BigCode's keys and values
    two views of one fused tensor, each storage counted once and whole."""
    caches = [cache.self_attention_cache, cache.cross_attention_cache] if hasattr(cache, "cross_attention_cache") else [cache]
    seen: dict[int, int] = {}
    for c in caches:
        for t in _tensors(getattr(c, "linear_cache", None)):   # MiniMaxCache keeps its lightning layers' state here
            if t.numel():
                seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        for layer in getattr(c, "layers", []):
            for attr in TENSOR_ATTRS:
                for t in _tensors(getattr(layer, attr, None)):
                    if t.numel():
                        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return sum(seen.values())


#: per-layer lists a config class derives from the depth: dropped where the tiny depth has no attention layer
PER_LAYER = ("layer_types", "mlp_layer_types", "layers_block_type", "attn_layer_indices")
#: keys the family audit's tiny config sets that a class derives otherwise (GPT-BigCode's K/V heads follow multi_query)
KV_EXTRA: dict[str, dict[str, Any]] = {"gpt_bigcode": {"num_key_value_heads": 1},
                                       # the second layer reuses the first's K/V (Gemma 3n's last 10-15 layers do)
                                       "gemma3n_text": {"num_kv_shared_layers": 1}}
#: the kinds of a hybrid's 4 layers where its class derives none with an attention layer at that depth
HYBRID_LAYERS: dict[str, dict[str, Any]] = {
    "bamba": {"attn_layer_indices": [1]},
    "granitemoehybrid": {"layer_types": ["linear_attention", "full_attention"] * 2},
    "bailing_hybrid": {"layer_types": ["linear_attention", "full_attention"] * 2, "mlp_layer_types": ["dense"] * 4},
    "zamba2": {"layers_block_type": ["mamba", "hybrid"] * 2},
    "jamba": {"attn_layer_period": 2, "attn_layer_offset": 1},
}


def audit(model_type: str, depth: int | None = None) -> dict[str, Any]:
    import torch
    import transformers

    try:
        config = tiny_config(model_type) | KV_EXTRA.get(model_type, {})
        config.pop("use_cache", None)
        if depth is not None:   # a hybrid whose two tiny layers are both recurrent: deep enough for an attention layer
            config = ({k: v for k, v in config.items() if k not in PER_LAYER} | {"num_hidden_layers": depth}
                      | HYBRID_LAYERS.get(model_type, {}))
        hf = transformers.AutoConfig.for_model(model_type, **{k: v for k, v in config.items()
                                                              if k not in ("model_type", "transformers_version")})
        with torch.device("meta"):   # some classes keep full-size parts the tiny widths do not reach (BLT's hashes)
            size = sum(p.numel() for p in transformers.AutoModelForCausalLM.from_config(hf).parameters())
        if size > MAX_PARAMS:
            return {"error": f"not tiny: {size / 1e6:.0f}M parameters at the audit's widths"}
        torch.manual_seed(0)
        model = transformers.AutoModelForCausalLM.from_config(hf).eval()
        ids = torch.randint(3, 200, (BATCH, PROMPT))
        out = model.generate(ids, max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False, return_dict_in_generate=True,
                             pad_token_id=0)
        spec = ModelSpec.from_any(dict(config))
        setup = Setup(task="infer", device="cpu", micro_batch_size=BATCH, seq_len=PROMPT, new_tokens=NEW, weights_dtype="fp32")
        return {"priced": kv_cache_bytes(spec, BATCH, cached_tokens(setup, spec), 4), "real": cache_bytes(out.past_key_values)}
    except Exception as exc:  # noqa: BLE001 - a type that does not build or generate is a row of the table, not a stop
        text = str(exc).splitlines()[0][:110] if str(exc) else ""
        if "get_seq_length" in text and depth is None:
            return audit(model_type, depth=4)
        return {"error": f"{type(exc).__name__}: {text}"}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", help="audit only these model types (prints, writes nothing)")
    args = ap.parse_args(argv)
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    rows = []
    for t in sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES):
        if args.only and t not in args.only:
            continue
        row = audit(t)
        rows.append((t, row))
        print(t, row, flush=True)
    if args.only:
        return 0

    def ratio(row: dict[str, Any]) -> float | None:
        return row["priced"] / row["real"] if row.get("real") else None

    def order(r: tuple[str, dict[str, Any]]) -> tuple[int, float]:
        x = ratio(r[1])
        return (0, -abs(x - 1)) if x is not None else (1 if "real" in r[1] else 2, 0.0)

    matched = sum(1 for _, r in rows if (x := ratio(r)) is not None and abs(x - 1) < 0.005)
    measured = sum(1 for _, r in rows if ratio(r) is not None)
    lines = [
        "# Inference cache of every decoder type (bench/kv_audit.py)",
        "",
        f"transformers {transformers.__version__}: the cache a greedy fp32 `generate` leaves ({BATCH} prompts of {PROMPT}",
        f"tokens, {NEW} new) on the family audit's tiny configs, against `memory.inference.kv_cache_bytes` at the positions",
        f"`cached_tokens` counts. Ratio = priced / real. {matched} of {measured} measured types within 0.5%; the rest",
        "first (furthest off first), then the types whose cache held nothing, then those that failed to build or generate.",
        "",
        "| model type | priced B | real B | ratio | note |",
        "|---|---|---|---|---|",
    ]
    for t, row in sorted(rows, key=order):
        x = ratio(row)
        cells = (f"{row['priced']} | {row['real']} | {x:.3f}" if x is not None
                 else f"{row.get('priced', '')} | {row.get('real', '')} | -")
        lines.append(f"| {t} | {cells} | {row.get('error', '')} |")
    OUT.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
