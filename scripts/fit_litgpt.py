"""Fit the bytes one block of litgpt's own GPT keeps for backward (perfguide/data/litgpt.json, memory/litgpt_blocks.py).

litgpt is not a perfguide dependency: run this in the separate virtual environment scripts/trace_litgpt.py describes
(``PYTHONPATH=. /tmp/venv_litgpt/bin/python scripts/fit_litgpt.py``); it prints the ``families`` table.

Each family's small GPT (litgpt 0.4.12, bf16-true as finetune/lora.py builds it: bf16 default dtype at construction,
``model.to(bfloat16)``, ``max_seq_length`` set afterwards as ``fit`` does, which rebuilds the rope cache in fp32) runs
one forward over b 2 x s 128 under perfguide's live-bytes tracker (memory/tracing/tracker.py, parameters and buffers
charged first), with one and with two blocks: the difference is one block's saved bytes. Two modes: every parameter
trainable (full fine-tuning), and LoRA r 8 on every block Linear with dropout 0 (litgpt's lora_query, key, value,
projection, mlp). Each is a linear form over the block's dims, from steps of one dim at a time around h 256, i 1024,
heads of 64 (phi: 80, so its 0.4 partial rotary is whole): ``i`` +1024, ``h`` +256 (heads unchanged), ``q`` +4 query
heads, ``kv`` +1 or +2 key/value groups (GQA families; the multi-head ones move q and kv together, so their q
coefficient carries both and kv is 0; ``<family>_mha`` fits a GQA family's code with as many groups as heads).
``frozen_linear_inputs_per_token`` is the full form minus the LoRA form plus the block Linears' distinct inputs (2 B
each), which the LoRA trace keeps for the adapters' ``lora_A``: what a block stops keeping once its Linears are frozen.
memory/lora_activations.py then adds each adapted Linear's own kept input back (with dropout: its dropped copy and
mask, one per litgpt LoRA Linear, q/k/v fused), which reproduces litgpt's dropout runs; without dropout litgpt's
adapters on Linears that share an input keep it once, which that per-Linear count overstates. Dropout is
left out: litgpt's blocks have none (its lora_dropout is priced by lora_activations). CPU SDPA saves what CUDA's fused
kernels do (output and an fp32 logsumexp per head).
"""

from __future__ import annotations

import json
from typing import Any

B, S, VOCAB = 2, 128, 1024
LORA_SWITCHES = ("query", "key", "value", "projection", "mlp")

#: family -> (litgpt config name, base overrides, head_size, kv step in groups (0: multi-head, q and kv move together),
#: the distinct inputs of the block's Linears as (h, q, i) multiples: the first norm's output (shared by qkv and the MLP
#: where one norm feeds both: phi, falcon), the second norm's, the attention output, the MLP's inner activation)
FAMILIES: dict[str, tuple[str, dict[str, Any], int, int, tuple[int, int, int]]] = {
    "llama": ("Llama-3-8B", {"n_head": 4, "n_query_groups": 2}, 64, 2, (2, 1, 1)),
    # Gemma at its real head layout (256 wide, scores scaled by 1/sqrt(256) in both generations): litgpt's bytes are
    # not linear in heads x head width across layouts, so a fit at heads of 64 under-prices Gemma's 256
    "gemma": ("Gemma-2b", {"n_head": 4, "n_query_groups": 1}, 256, 1, (2, 1, 1)),
    # Gemma 2: attention soft-capping takes litgpt off SDPA onto its own scores (per_head_s2), two more norms
    "gemma2": ("Gemma-2-2b", {"n_head": 4, "n_query_groups": 2}, 256, 2, (2, 1, 1)),
    # multi-head variants: with as many key/value groups as heads litgpt never expands k and v (CausalSelfAttention:
    # ``if n_query_groups != n_head``), so SDPA saves views of the fused qkv output instead of expanded copies
    "llama_mha": ("Llama-3-8B", {"n_head": 4, "n_query_groups": 4}, 64, 0, (2, 1, 1)),
    "gemma_mha": ("Gemma-2b", {"n_head": 4, "n_query_groups": 4}, 256, 0, (2, 1, 1)),
    "phi": ("phi-2", {"n_head": 4, "n_query_groups": 4}, 80, 0, (1, 1, 1)),
    "phi3": ("Phi-3-mini-4k-instruct", {"n_head": 4, "n_query_groups": 4}, 64, 0, (2, 1, 1)),
    "gpt_neox": ("stablelm-base-alpha-3b", {"n_head": 4, "n_query_groups": 4}, 64, 0, (2, 1, 1)),
    "falcon": ("falcon-7b", {"n_head": 4, "n_query_groups": 1}, 64, 1, (1, 1, 1)),
}


def forward_bytes(name: str, n_layer: int, lora: bool, seq: int = S, dropout: float = 0.0, **overrides: Any) -> int:
    """Bytes born in one forward and alive when it returns (the logits chunks included)."""
    import torch
    from trace_litgpt import build, charged

    switches = {f"lora_{t}": lora for t in LORA_SWITCHES}
    model = build(name, lora, n_layer=n_layer, padded_vocab_size=VOCAB, vocab_size=VOCAB, lora_r=8, lora_alpha=16,
                  lora_dropout=dropout, **switches, **overrides)
    tracker = charged(model)
    with tracker:
        start = tracker.total
        out = model(torch.randint(0, VOCAB, (B, seq)), lm_head_chunk_size=128)
        kept = tracker.total - start
        del out
    return int(kept)


def block_bytes(name: str, lora: bool, seq: int = S, dropout: float = 0.0, **overrides: Any) -> float:
    """One block's saved bytes per token: two blocks minus one."""
    one, two = (forward_bytes(name, n, lora, seq, dropout, **overrides) for n in (1, 2))
    return (two - one) / (B * seq)


def per_head_s2(name: str, lora: bool, heads: int, **point: Any) -> float:
    """Bytes per b x heads x s^2 one block keeps beyond its per-token form: litgpt's own soft-capped attention
    (scores, tanh, fp32 softmax, its 16-bit copy); 0 where SDPA runs. The block's bytes at s 64, 128 and 192: their
    second difference is the s^2 term alone (per-token bytes and any per-block constant cancel)."""
    total = [block_bytes(name, lora, seq, **point) * B * seq for seq in (S // 2, S, 3 * S // 2)]
    return round((total[2] - 2 * total[1] + total[0]) / (2 * B * heads * (S // 2) ** 2), 3)


def fit(family: str) -> dict[str, dict[str, float]]:
    name, base, head, kv_step, (n_h, n_q, n_i) = FAMILIES[family]
    heads, groups = base["n_head"], base["n_query_groups"]
    dims = {"h": 256, "i": 1024, "q": heads * head, "kv": groups * head}
    point = {"n_embd": dims["h"], "intermediate_size": dims["i"], "head_size": head, **base}
    steps: dict[str, tuple[dict[str, Any], float]] = {
        "h": ({"n_embd": dims["h"] + 256}, 256),
        "i": ({"intermediate_size": dims["i"] + 1024}, 1024),
        "q": ({"n_head": heads + 4, "n_query_groups": groups + (0 if kv_step else 4)}, 4 * head),
    }
    if kv_step:
        steps["kv"] = ({"n_query_groups": groups + kv_step, "n_head": heads if heads % (groups + kv_step) == 0 else 2 * heads}, kv_step * head)
    out: dict[str, dict[str, float]] = {}
    s2 = {mode: per_head_s2(name, lora, heads, **point) for mode, lora in (("full", False), ("lora", True))}
    for mode, lora in (("full", False), ("lora", True)):
        at = block_bytes(name, lora, **point) - s2[mode] * heads * S
        coef: dict[str, float] = {}
        for dim, (change, width) in steps.items():
            moved = block_bytes(name, lora, **{**point, **change}) - s2[mode] * change.get("n_head", heads) * S
            if dim == "kv" and change["n_head"] != heads:   # the q step taken with it comes off first
                moved -= coef["q"] * (change["n_head"] - heads) * head
            coef[dim] = round((moved - at) / width, 3)
        coef["1"] = round(at - sum(coef[d] * dims[d] for d in coef), 1)
        out[mode] = coef
    frozen = {d: round(out["full"].get(d, 0.0) - out["lora"].get(d, 0.0), 3) for d in ("h", "i", "q", "kv", "1")}
    frozen["h"] += 2 * n_h   # the adapter inputs perfguide's LoRA model adds back (16-bit: 2 B each)
    frozen["q"] += 2 * n_q
    frozen["i"] += 2 * n_i
    frozen["1"] = 0.0   # the LoRA trace's constant is the adapters' r-wide outputs, which lora_activations prices itself
    inputs = {"h": 2.0 * n_h, "q": 2.0 * n_q, "i": 2.0 * n_i}
    fitted: dict[str, Any] = {"per_token": {d: v for d, v in out["full"].items() if v},
                              "frozen_linear_inputs_per_token": {d: v for d, v in frozen.items() if v},
                              "linear_inputs_per_token": inputs}
    if s2["full"] or s2["lora"]:   # frozen Linears keep the scores all the same: one term for both modes
        assert s2["full"] == s2["lora"], s2
        fitted["per_head_s2"] = s2["full"]
    return fitted


#: the references of tests/test_litgpt_blocks.py at dims the fit never used: Gemma's and Gemma 2's real 2b blocks
CHECKS: dict[str, tuple[str, dict[str, Any]]] = {
    "gemma-2b": ("Gemma-2b", {"n_embd": 2048, "intermediate_size": 16384, "n_head": 8, "n_query_groups": 1}),
    "gemma-2-2b": ("Gemma-2-2b", {"n_embd": 2304, "intermediate_size": 9216, "n_head": 8, "n_query_groups": 4}),
}


def check() -> None:
    """Traced bytes per token of one real-sized block at s 256 (the build's max_seq_length): full fine-tuning, and
    LoRA r 8 on every block Linear with dropout 0.05."""
    for key, (name, dims) in CHECKS.items():
        print(json.dumps({"check": key, "seq": 256, "full": block_bytes(name, False, 256, **dims),
                          "lora_dropout_0.05": block_bytes(name, True, 256, 0.05, **dims)}), flush=True)


def main() -> None:
    import sys
    if sys.argv[1:] == ["check"]:
        return check()
    chosen = sys.argv[1:] or list(FAMILIES)
    print(json.dumps({family: fit(family) for family in chosen}, indent=1))


if __name__ == "__main__":
    main()
