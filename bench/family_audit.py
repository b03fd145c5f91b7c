"""Audit the activation tables of decoder model types that have none of their own (an alias, the catalog's family or
"generic"): what perfguide prices per token for one block against what the memory tracer finds the real block saves.

Run: ``HF_HUB_OFFLINE=1 nice .venv/bin/python bench/family_audit.py [--only TYPE ...]``; prints each row and writes
bench/results/family_audit.md. For every model type in transformers' causal-LM mapping whose activations resolve
through an alias or a fallback, a tiny config is built from the type's own config class (its defaults keep the
family's structure: multi-query, parallel blocks, activation, biases, norms) with the dims shrunk to hidden 128,
8 heads of 16, 2 key/value heads where the class has the key, FFN 448 where the class sizes it, 4 experts top-2 for
MoE. Traced: the tracer's bytes for one block (two-block minus one-block model) at batch 2 and 4 of 64 tokens,
differenced, per token (scripts/fit_activations.py ``token_slope``: per-block constants cancel). Priced:
``layer_bytes`` of the ModelSpec read from the same config, same two batches. A ratio far from 1 is a table the type
should not share; a type that fails to build or trace is listed with the reason.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from fit_activations import BATCHES, SEQ, token_slope

from perfguide.memory.activations import family_name, layer_bytes
from perfguide.memory.activations_data import activations_data
from perfguide.model.code import built_by
from perfguide.model.fields import family
from perfguide.model.types import ModelSpec
from perfguide.setup import Setup

OUT = ROOT / "bench" / "results" / "family_audit.md"
REGIMES: dict[str, dict[str, Any]] = {"half": {"weights_dtype": "bf16"}, "amp": {"autocast": "bf16"}}
#: the types users fine-tune most (the task's priority list), reported first
POPULAR = ("qwen2", "mistral", "falcon", "bloom", "starcoder2", "gpt_bigcode", "cohere", "granite", "deepseek_v3",
           "gpt_oss", "olmoe", "mpt")
#: types this audit gave a table of their own, still audited (their first ratios are in the report's header)
FITTED = {"falcon": 40, "starcoder2": 40, "gpt_bigcode": 40, "mpt": 40, "olmoe": 40, "bloom": 40, "cohere": 40,
          "gpt_oss": 41, "glm4": 70, "glm4_moe": 70, "deepseek_v3": 70, "glm4_moe_lite": 70, "qwen3_5_text": 70, "qwen3_5_moe_text": 70, "qwen3_next": 70, "minimax_m2": 70, "lfm2": 70,
          "granitemoehybrid": 71, "bamba": 71, "falcon_h1": 71, "llama4_text": 71, "gemma3n_text": 73,
          "ernie4_5_moe": 72, "afmoe": 72, "apertus": 72, "arcee": 72, "hyperclovax": 72, "exaone4": 72, "gemma4_text": 73}
#: config keys set when the type's config class has them (directly or through its attribute_map)
DIMS: dict[str, Any] = {"hidden_size": 128, "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 16,
                        "num_hidden_layers": 2, "vocab_size": 512, "max_position_embeddings": 1024,
                        "tie_word_embeddings": False, "pad_token_id": 0,
                        # FFN widths under their several names
                        "intermediate_size": 448, "n_inner": 448, "ffn_dim": 448, "ffn_hidden_size": 448,
                        # MoE: 4 routed experts, top-2, narrow experts, every layer routed
                        "num_experts": 4, "num_local_experts": 4, "n_routed_experts": 4, "moe_num_experts": 4,
                        "num_experts_per_tok": 2, "moe_intermediate_size": 64, "first_k_dense_replace": 0,
                        "n_group": 1, "topk_group": 1,
                        # DeepSeek-style latent attention shrunk with the rest
                        "kv_lora_rank": 32, "q_lora_rank": 64, "qk_rope_head_dim": 8, "qk_nope_head_dim": 16,
                        "v_head_dim": 24,
                        # partial rotary (CodeGen, GPT-J style) within the 16-wide heads
                        "rotary_dim": 8}
#: keys a type's config class validates against the depth (GPT-Neo's global/local pattern of 2 layers)
EXTRA: dict[str, dict[str, Any]] = {"gpt_neo": {"attention_types": [[["global", "local"], 1]]},
                                    # every DeepSeek-V3 release: as many K/V heads as query heads, values narrower than
                                    # queries and keys (128 vs 192), which decides the CUDA kernel (flash needs equal dims)
                                    "deepseek_v3": {"num_key_value_heads": 8, "v_head_dim": 16},
                                    # hybrids whose two blocks are both recurrent: no attention layer for the cache's
                                    # length (transformers' get_seq_length refuses), so no cache in training
                                    "qwen3_5_text": {"use_cache": False}, "qwen3_next": {"use_cache": False},
                                    "qwen3_5_moe_text": {"use_cache": False}, "granitemoehybrid": {"use_cache": False},
                                    "bamba": {"use_cache": False},
                                    # DeepSeek-V3.2's lightning indexer shrunk with the rest (its rope part is
                                    # qk_rope_head_dim wide, so its heads must be wider than that)
                                    "deepseek_v32": {"num_key_value_heads": 8, "v_head_dim": 16, "index_head_dim": 16,
                                                     "index_n_heads": 4, "index_topk": 32},
                                    # Gemma-4 as its 26B-A4B and 31B: full-attention layers twice as wide per head
                                    # with fewer K/V heads, their keys doubling as values, no per-layer embeddings
                                    # (the E2B / E4B's, which the class defaults carry, are not priced); both
                                    # blocks full, so the one-block model is the same kind of block
                                    "gemma4_text": {"global_head_dim": 32, "num_global_key_value_heads": 2,
                                                    "attention_k_eq_v": True, "vocab_size_per_layer_input": 512,
                                                    "hidden_size_per_layer_input": 0, "layer_types": ["full_attention"] * 2},
                                    # Gemma-4-12B (gemma4_unified: Gemma 4's block without per-layer embeddings or
                                    # MoE, which its class refuses to set), as Gemma 4
                                    "gemma4_unified_text": {"global_head_dim": 32, "num_global_key_value_heads": 2,
                                                            "attention_k_eq_v": True, "layer_types": ["full_attention"] * 2},
                                    # Gemma 3n (E2B / E4B): no layer reusing another's K/V (the class's default 15
                                    # exceed the tiny depth), the per-layer embeddings' table shrunk with the
                                    # vocabulary, both blocks full
                                    "gemma3n_text": {"num_kv_shared_layers": 0, "vocab_size_per_layer_input": 512,
                                                     "layer_types": ["full_attention"] * 2},
                                    # DeepseekV2Config leaves top-k unset (None) by default
                                    "deepseek_v2": {"num_experts_per_tok": 2}}


def audited_types() -> list[tuple[str, str, str]]:
    """(model_type, table it resolves to, how) for causal-LM types without a table of their own."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    data = activations_data()
    out = []
    for t in sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES):
        if t in data.families and t not in FITTED:
            continue
        how = f"own table (stop {FITTED[t]})" if t in FITTED else "alias" if t in data.aliases else (
            "catalog" if family(t) != "generic" else "generic")
        out.append((t, family_name(family(t), t), how))
    return out


def tiny_config(model_type: str) -> dict[str, Any]:
    """The type's default config with the dims shrunk (only keys its class has), as a raw config dict."""
    from transformers import AutoConfig

    default = AutoConfig.for_model(model_type)
    if default.is_encoder_decoder:
        raise ValueError("encoder-decoder config (priced as seq2seq)")
    written = default.to_dict()
    have = set(written) | set(getattr(default, "attribute_map", {}))
    # Gemma-4's head_dim is per layer: its config refuses the attribute, its dict has it
    kwargs = {k: v for k, v in DIMS.items() if k in have and (written[k] if k in written else getattr(default, k, None)) is not None}
    if "qk_rope_head_dim" in kwargs:   # latent attention: the head dims are the qk_* / v_head_dim keys
        kwargs.pop("head_dim", None)
    return dict(AutoConfig.for_model(model_type, **{**kwargs, **EXTRA.get(model_type, {})}).to_dict())


#: gated-DeltaNet hybrids are audited at 512 tokens: transformers' reference code keeps less in its first 64-token
#: chunk, and the table prices the per-token bytes of longer sequences (scripts/fit_linear_attention.py)
SEQS = {"qwen3_5_text": 512, "qwen3_next": 512, "qwen3_5_moe_text": 512}


def priced_slope(config: dict[str, Any], regime: dict[str, Any], seq: int = SEQ) -> float:
    # as a plan prices it: the model as transformers builds it (Llama-4's every expert over every token, model/code.py)
    spec = built_by(ModelSpec.from_any(dict(config)), "transformers")
    a, b = (layer_bytes(spec, Setup(micro_batch_size=bs, seq_len=seq, optimizer="sgd", **regime)) for bs in BATCHES)
    return (b - a) / ((BATCHES[1] - BATCHES[0]) * seq)


def refuses_sdpa(model_type: str) -> bool:
    """The causal-LM class refuses SDPA (``_supports_sdpa`` false, also by not declaring it): it loads eager."""
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return not getattr(getattr(transformers, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type]), "_supports_sdpa", False)


def audit(model_type: str) -> dict[str, Any]:
    row: dict[str, Any] = {}
    try:
        config = tiny_config(model_type)
        attn = {"attn_implementation": "eager"} if refuses_sdpa(model_type) else {}
        if attn:
            row["eager"] = True
        for name, kw in REGIMES.items():
            seq = SEQS.get(model_type, SEQ)
            row[name] = (priced_slope(config, {**kw, **attn}, seq), token_slope(config, {**kw, **attn}, seq))
    except Exception as exc:  # noqa: BLE001 - a type that does not build or trace is a row of the table, not a stop
        text = str(exc).splitlines()[0][:110] if str(exc) else ""
        if "Expected inputs of BF16 type" in text:
            # fp32 experts under autocast: grouped_mm is on no autocast list and has no fp32 fake kernel
            text = "amp not traced: the fake tracer has no fp32 grouped_mm (MoE experts)"
        row["error"] = f"{type(exc).__name__}: {text}"
    return row


def _cells(row: dict[str, Any], regime: str) -> str:
    if regime not in row:
        return " | | "
    priced, traced = row[regime]
    return f"{priced:.0f} | {traced:.0f} | {priced / traced:.3f}" if traced else f"{priced:.0f} | {traced:.0f} | -"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", help="audit only these model types (prints, writes nothing)")
    args = ap.parse_args(argv)
    import transformers

    types = [t for t in audited_types() if not args.only or t[0] in args.only]
    rows = []
    for t, table, how in types:
        row = audit(t)
        rows.append((t, table, how, row))
        print(t, table, how, {k: v for k, v in row.items()}, flush=True)
    if args.only:
        return 0

    def order(r: tuple[str, str, str, dict[str, Any]]) -> tuple[int, float]:
        pt, tr = r[3].get("half", (0.0, 0.0))
        return (0 if r[0] in POPULAR else 1 if tr else 2, -abs(pt / tr - 1) if tr else 0.0)

    lines = [
        "# Activation tables of decoder types without their own (bench/family_audit.py)",
        "",
        f"transformers {transformers.__version__}: every causal-LM model type whose activation table is an alias, the",
        "catalog's family or `generic`. Bytes one block keeps for backward per token (SDPA, no checkpointing, full",
        f"fine-tuning), batch {BATCHES[0]} and {BATCHES[1]} of {SEQ} tokens differenced; tiny configs from each type's own",
        "config class (hidden 128, 8 heads of 16, 2 KV heads and FFN 448 where the class has the key; 4 experts top-2).",
        "half = bf16 weights; amp = fp32 weights under bf16 autocast. Ratio = priced / traced. Popular types first, then",
        "by how far off the half-precision price is. A class that refuses SDPA is traced and priced with eager attention",
        f"at {SEQ} tokens (its s x s terms included). Rows marked 'own table (stop 40)' were fitted after their first",
        "audit (priced / traced then, half and amp: falcon 1.139 / 1.522 through the gpt2 alias at 64 tokens, which",
        "has no s x s term for Falcon-7B's math-path SDPA, starcoder2 1.810 /",
        "1.658, gpt_bigcode 1.706 / 1.818, mpt 1.500 / 1.597 and cohere 1.043 / 1.091 through generic, olmoe 0.827 in",
        "half through generic, bloom 1.142 / 1.798 through the gpt2 alias; gpt_oss 0.788 in half through mixtral, stop 41;",
        "stop 70, half / amp where traced: glm4 0.778 / 0.833 and olmo3 0.778 / 0.869 through generic, qwen3_5_text 0.71 at",
        "64 tokens through generic (its DeltaNet layers then priced as attention), glm4_moe 0.693, glm4_moe_lite 0.559 and",
        "minimax_m2 0.808 through generic, deepseek_v3 0.830 through mixtral; the gated-DeltaNet hybrids are traced at 512",
        "tokens, past transformers' reference code's first 64-token chunk, which keeps less; lfm2 0.807 / 0.836 through",
        "generic, and 1.15 at LFM2-1.2B's widths, its FFN read at the written block_ff_dim; stop 71: granitemoehybrid and",
        "bamba, Mamba-2 hybrids the tracer reached only with the cache off, 0.0015 in half through generic: their Mamba-2",
        "layers priced as attention, where transformers' reference code pads 64 tokens to a 256-token chunk and keeps",
        "every chunk's score matrices and state in fp32; falcon_h1 0.001 / 0.003, its side-by-side Mamba-2 mixers the",
        "same; nemotron_h's single-mixer layers of four kinds are checked per kind in tests/test_layer_kinds.py).",
        "Priced as a plan prices the model: as transformers builds it (model/code.built_by; since stop 71, when",
        "llama4_text's every-expert MoE showed 0.624 / 0.922 priced at its router's top-k). Stop 72: an unknown type",
        "takes the generic table of its structure (generic_moe: qwen3_moe's; generic_mla: mla; generic_mla_moe:",
        "deepseek_v3), where every MoE type had the dense generic table (half: afmoe 0.464, ernie4_5_moe 0.585,",
        "hy_v3 0.618, sarvam_moe 0.596, minimax 0.656, aria_text 0.545, minicpm3 0.769); own tables for ernie4_5_moe,",
        "afmoe, apertus (0.729 / 0.618), arcee (1.396 / 1.361), hyperclovax (0.803 / 0.833) and exaone4 (0.863 /",
        "0.941); granitemoe and phimoe share mixtral's; deepseek_v32 deepseek_v3's (0.813 through the catalog's mixtral).",
        "",
        "| model type | table used | via | half priced | half traced | half ratio | amp priced | amp traced | amp ratio | note |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for t, table, how, row in sorted(rows, key=order):
        note = "; ".join(n for n in (row.get("error", ""), "eager (the class refuses SDPA)" if row.get("eager") else "") if n)
        lines.append(f"| {t}{' *' if t in POPULAR else ''} | {table} | {how} | {_cells(row, 'half')} | {_cells(row, 'amp')} | {note} |")
    OUT.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
