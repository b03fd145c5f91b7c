"""Fit the latent-attention (MLA) block of perfguide/data/activations.json: family ``mla``, the dense block of DeepSeek-V3
and of the models that run its attention (Kimi-K2, Moonlight, GLM-4.7-Flash), which their MoE tables extend.

Run: ``HF_HUB_OFFLINE=1 .venv/bin/python scripts/fit_mla.py [--dry-run]``, then
``scripts/fit_moe_activations.py --family deepseek_v3 --family glm4_moe_lite`` (their tables start from this one).

DeepSeek-V3's attention (transformers ``DeepseekV3Attention``) keeps other tensors than Llama's: q goes through a low-rank
``q_a_proj`` / RMSNorm / ``q_b_proj`` (``q_lora_rank``; Moonlight and DeepSeek-V2-Lite project q directly), k and v through
the compressed latent (``kv_lora_rank``) and its RMSNorm before ``kv_b_proj``, the rotary part of k is one head
(``qk_rope_head_dim``) broadcast to every head, and q / k are concatenated from their rotary and non-rotary parts; the
values are ``v_head_dim`` wide per head. So the linear form of ``activations.block_dims`` takes four more widths:
``ql`` (q_lora_rank, 0 without), ``kvl`` (kv_lora_rank), ``vh`` (heads x v_head_dim), ``r`` (qk_rope_head_dim); ``q``
and ``kv`` are heads x (qk_nope_head_dim + qk_rope_head_dim), as the spec's head_dim is.

Traced with the memory tracer on fake tensors (scripts/fit_activations.py ``token_slope``: one block of a two-block model,
two batch sizes), every layer dense (``first_k_dense_replace`` past the depth), at 10 points that move one width at a
time; values narrower than q and k at every point, as in every DeepSeek release (which decides the CUDA SDPA kernel).
``frozen_linear_inputs_per_token`` is fitted the same way (full fine-tuning minus LoRA on every Linear, as
``fit_activations.frozen_slope``). The terms the dense block does not change (eager attention's s x s bytes, the
checkpoint boundary, the logits, dropout) are the llama table's.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from fit_activations import DATA, REGIMES, frozen_slope, least_squares, token_slope, write_data

#: widths of a fit point: hidden, dense FFN, heads, q rank (0: q projected directly), latent rank, nope / rope / value
#: head dims
BASE = {"h": 64, "i": 128, "heads": 4, "ql": 48, "kvl": 32, "n": 24, "rope": 8, "v": 16}
STEPS = (BASE, {**BASE, "h": 128}, {**BASE, "i": 256}, {**BASE, "heads": 8}, {**BASE, "ql": 96}, {**BASE, "ql": 0},
         {**BASE, "kvl": 64}, {**BASE, "n": 40}, {**BASE, "rope": 16}, {**BASE, "v": 24})
TERMS = ("h", "i", "q", "ql", "kvl", "vh", "r", "1")


#: GLM-4.7-Flash's values are as wide as q and k (256 = 192 + 64), which takes the CUDA SDPA flash kernel where
#: DeepSeek's narrower values take the memory-efficient one: family ``mla_equal_v`` is fitted with v = nope + rope at
#: every point (``vh`` then equals ``q`` and is folded into it)


def equal_v(p: dict[str, int]) -> dict[str, int]:
    return {**p, "v": p["n"] + p["rope"]}


def dims(p: dict[str, int]) -> dict[str, int]:
    q = p["heads"] * (p["n"] + p["rope"])
    return {"h": p["h"], "i": p["i"], "q": q, "ql": p["ql"], "kvl": p["kvl"], "vh": p["heads"] * p["v"], "r": p["rope"],
            "1": 1}


def config(p: dict[str, int]) -> dict[str, Any]:
    """A DeepSeek-V3 of dense blocks (``q`` and ``kv`` of the form are the same width: as many K/V heads as query heads)."""
    return dict(model_type="deepseek_v3", hidden_size=p["h"], intermediate_size=p["i"], num_attention_heads=p["heads"],
                num_key_value_heads=p["heads"], q_lora_rank=p["ql"] or None, kv_lora_rank=p["kvl"],
                qk_nope_head_dim=p["n"], qk_rope_head_dim=p["rope"], v_head_dim=p["v"], num_hidden_layers=2,
                first_k_dense_replace=2, n_routed_experts=1, num_experts_per_tok=1, n_shared_experts=0,
                moe_intermediate_size=p["i"], n_group=1, topk_group=1, vocab_size=4096, tie_word_embeddings=False, max_position_embeddings=1024,
                pad_token_id=0, eos_token_id=1, bos_token_id=2)


def main(argv: list[str] | None = None) -> int:
    dry = "--dry-run" in (argv if argv is not None else sys.argv[1:])
    data = json.loads(DATA.read_text(encoding="utf-8"))
    for family, points, terms in (("mla", STEPS, TERMS),
                                  ("mla_equal_v", tuple(equal_v(p) for p in STEPS if p["v"] == BASE["v"]),
                                   tuple(t for t in TERMS if t != "vh"))):
        data["families"][family] = fit_family(family, data, points, terms)
    write_data(data, dry)
    return 0


def fit_family(family: str, data: dict[str, Any], points: tuple[dict[str, int], ...], terms: tuple[str, ...]) -> dict[str, Any]:
    import torch
    import transformers

    regimes = {}
    for name, regime in REGIMES.items():
        table = dict(data["families"]["llama"]["regimes"][name])
        rows = [dims(p) for p in points]
        table["per_token"] = least_squares(rows, [token_slope(config(p), regime) for p in points], terms)
        table["frozen_linear_inputs_per_token"] = least_squares(rows, [frozen_slope(config(p), regime) for p in points], terms)
        regimes[name] = table
        print(f"  {family}/{name}: {json.dumps(table['per_token'])}, frozen "
              f"{json.dumps(table['frozen_linear_inputs_per_token'])}", flush=True)
    equal = " Values as wide as q and k at every point (v = nope + rope: the CUDA flash kernel); vh folded into q." \
        if family == "mla_equal_v" else " Values narrower than q and k at every point (the memory-efficient kernel)."
    return {"regimes": regimes, "source": (
        f"scripts/fit_mla.py: fake-tensor traces of transformers' DeepSeek-V3 blocks with dense FFNs (torch "
        f"{torch.__version__}, transformers {transformers.__version__}), one-minus-two-block differences at two batch "
        f"sizes, at {len(points)} points around {points[0]} (q_lora_rank 0: q projected directly); per token over h, i, q = heads "
        "x (nope + rope), ql = q_lora_rank, kvl = kv_lora_rank, vh = heads x v_head_dim, r = qk_rope_head_dim. "
        "frozen_linear_inputs: full fine-tuning minus LoRA on every Linear, the adapters' own tensors added back. Eager, "
        "checkpoint, logits and dropout terms: the llama table's. Block code: transformers/models/deepseek_v3/"
        "modeling_deepseek_v3.py (DeepseekV3Attention)." + equal)}


if __name__ == "__main__":
    sys.exit(main())
