"""Fit the layers priced whole by kind in perfguide/data/activations.json: NVIDIA Nemotron-H's four kinds
(``linear_attention.nemotron_h``) and Falcon-H1's hybrid layer (``linear_attention.falcon_h1``).

Run: ``HF_HUB_OFFLINE=1 .venv/bin/python scripts/fit_layer_kinds.py [--dry-run] [KIND ...]`` (kinds: attention, mlp,
moe, mamba, hybrid; all by default).

Nemotron-H (Nemotron-H 4B-56B, Nemotron-3 Nano / Super / Ultra) is not a stack of one repeated block: each layer is a
norm and one mixer (transformers' ``NemotronHBlock``), a Mamba-2 mixer, attention, a dense MLP or a MoE block, in the
order the config's ``hybrid_override_pattern`` / ``layers_block_type`` spells (Nemotron-3-Nano-30B-A3B: 23 Mamba, 23
MoE, 6 attention). A family table prices a whole attention-and-FFN block per layer, so each kind gets its own linear form
here, and ``layer_bytes`` takes their mean over the depth (memory/linear_attention.py ``kind_mean_per_token``).

Each kind is traced as a two-layer model of that kind minus a one-layer one (scripts/fit_activations.py ``block_bytes``,
fake tensors, the CUDA autocast lists and SDPA kernel choice emulated), at batch 2 and two lengths (512 and 1,024
tokens: two and four of the largest chunk), per token:

* ``attention``: over ``h``, ``q`` (heads x head dim), ``kv``, ``ah`` (heads);
* ``mlp``: the non-gated ReLU^2 MLP, over ``h`` and ``i``;
* ``moe``: over ``h``, ``hk`` (the routed experts' width x top-k: the dispatch copy per routed pair; the width is the
  hidden size, or ``moe_latent_size`` where the experts run in a latent space, Nemotron-3 Super and Ultra), ``ir``
  (top-k x expert width), ``si`` (the shared expert's width), ``e`` (routed experts), ``k`` and ``ml`` (the latent
  width, 0 without: the down- and up-projections to it). Its experts run ``grouped_mm``, whose fake kernel
  refuses fp32 operands, so the fp32 and autocast regimes of this kind are traced with real CPU tensors instead
  (``saved_tensors_hooks`` over a one-layer and a two-layer model; scripts/fit_moe_activations.py ``saved_bytes``);
* ``mamba``: Nemotron-H's Mamba-2 mixer is Granite-4.0-H's code (scripts/fit_mamba.py), both paths (transformers'
  reference code, mamba-ssm's fused kernel as a stand-in saving what its autograd Function saves), over ``h`` and the
  mixer's dims (``memory/linear_attention.py`` ``mamba2_dims``).

Falcon-H1's every layer (``FalconH1DecoderLayer``) runs attention and the same Mamba-2 mixer side by side on one normed
input (with muP multipliers), then a gated MLP: one kind, ``hybrid``, over the attention's, the MLP's and the mixer's
dims, both kernel paths, at the config class's default ``mamba_rms_norm`` false (the scan's output gated by z inside
the chunk scan, no grouped RMSNorm: every released Falcon-H1 config).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

from fit_activations import DATA, block_bytes, least_squares, write_data
from fit_mamba import kernels

from perfguide.setup import Setup

REGIMES = {"fp32": {}, "amp": {"autocast": "bf16"}, "half": {"weights_dtype": "bf16"}}
BATCH, LENGTHS = 2, (512, 1024)
Point = dict[str, int]

BASE: dict[str, Point] = {
    "attention": {"h": 256, "heads": 4, "kv": 2, "hd": 64},
    "mlp": {"h": 256, "i": 512},
    "moe": {"h": 256, "ie": 64, "e": 8, "k": 2, "si": 128, "lat": 0},
    "mamba": {"h": 256, "mh": 8, "hd": 64, "n": 64, "g": 2, "chunk": 64},
    "hybrid": {"h": 256, "heads": 2, "kv": 1, "ahd": 64, "i": 512, "mh": 8, "hd": 64, "n": 64, "g": 1, "chunk": 64},
}


def _steps(kind: str, changes: list[Point]) -> list[Point]:
    return [BASE[kind], *({**BASE[kind], **c} for c in changes)]


STEPS: dict[str, list[Point]] = {
    "attention": _steps("attention", [{"h": 512}, {"heads": 8}, {"kv": 4}, {"hd": 128}, {"heads": 8, "hd": 128}]),
    "mlp": _steps("mlp", [{"h": 512}, {"i": 1024}, {"h": 512, "i": 1024}]),
    "moe": _steps("moe", [{"h": 512}, {"ie": 128}, {"e": 16}, {"k": 4}, {"si": 256}, {"h": 512, "k": 4},
                          {"ie": 128, "k": 4}, {"lat": 128}, {"lat": 64}, {"lat": 128, "k": 4}, {"lat": 128, "h": 512},
                          {"lat": 64, "ie": 128}]),
    "mamba": _steps("mamba", [{"h": 512}, {"mh": 16, "hd": 32}, {"hd": 128}, {"n": 128}, {"g": 4}, {"chunk": 128},
                              {"n": 128, "chunk": 128}, {"mh": 16, "hd": 32, "n": 128}, {"hd": 128, "n": 128}]),
    "hybrid": _steps("hybrid", [{"h": 512}, {"heads": 4}, {"kv": 2}, {"ahd": 128}, {"i": 1024}, {"mh": 16, "hd": 32},
                                {"hd": 128}, {"n": 128}, {"g": 2}, {"chunk": 128}, {"n": 128, "chunk": 128},
                                {"mh": 16, "hd": 32, "n": 128}, {"hd": 128, "n": 128}, {"heads": 4, "ahd": 128}]),
}
TERMS = {"attention": ("h", "q", "kv", "ah", "1"), "mlp": ("h", "i", "1"),
         "moe": ("h", "hk", "ir", "si", "e", "k", "ml", "1"),
         "mamba": ("h", "md", "mh", "mgn", "mhn", "mhl", "mdnl", "1"),
         "hybrid": ("h", "q", "kv", "ah", "i", "md", "mh", "mgn", "mhn", "mhl", "mdnl", "1")}
LAYER = {"attention": "attention", "mlp": "mlp", "moe": "moe", "mamba": "mamba"}
MODEL = {"attention": "nemotron_h", "mlp": "nemotron_h", "moe": "nemotron_h", "mamba": "nemotron_h",
         "hybrid": "falcon_h1"}


def dims(kind: str, p: Point) -> dict[str, int]:
    """The linear form's dims at a fit point (memory/linear_attention.py ``nemotron_dims`` names them)."""
    if kind == "attention":
        return {"h": p["h"], "q": p["heads"] * p["hd"], "kv": p["kv"] * p["hd"], "ah": p["heads"], "1": 1}
    if kind == "mlp":
        return {"h": p["h"], "i": p["i"], "1": 1}
    if kind == "moe":
        width = p["lat"] or p["h"]   # the routed experts' input and output width: the latent one where there is one
        return {"h": p["h"], "hk": width * p["k"], "ir": p["k"] * p["ie"], "si": p["si"], "e": p["e"], "k": p["k"],
                "ml": p["lat"], "1": 1}
    md = p["mh"] * p["hd"]
    mamba = {"h": p["h"], "md": md, "mh": p["mh"], "mgn": p["g"] * p["n"], "mhn": p["mh"] * p["n"],
             "mhl": p["mh"] * p["chunk"], "mdnl": md * p["n"] // p["chunk"], "1": 1}
    if kind == "hybrid":
        return {**mamba, "q": p["heads"] * p["ahd"], "kv": p["kv"] * p["ahd"], "ah": p["heads"], "i": p["i"]}
    return mamba


def falcon_config(p: Point, layers: int = 2) -> dict[str, Any]:
    """A Falcon-H1 config of ``layers`` layers at fit point ``p``."""
    return dict(model_type="falcon_h1", hidden_size=p["h"], num_hidden_layers=layers, vocab_size=512,
                tie_word_embeddings=False, num_attention_heads=p["heads"], num_key_value_heads=p["kv"],
                head_dim=p["ahd"], intermediate_size=p["i"], mamba_n_heads=p["mh"], mamba_d_head=p["hd"],
                mamba_d_ssm=p["mh"] * p["hd"], mamba_d_state=p["n"], mamba_n_groups=p["g"], mamba_chunk_size=p["chunk"],
                mamba_d_conv=4, use_cache=False, pad_token_id=0, eos_token_id=1, bos_token_id=2)


def config(kind: str, p: Point, layers: int = 2) -> dict[str, Any]:
    """A config of ``layers`` layers of ``kind`` at fit point ``p`` (Nemotron-H's other kinds' keys at fixed sizes)."""
    if kind == "hybrid":
        return falcon_config(p, layers)
    c: dict[str, Any] = dict(model_type="nemotron_h", hidden_size=p["h"], num_hidden_layers=layers,
                             layer_types=[LAYER[kind]] * layers, vocab_size=512, tie_word_embeddings=False,
                             num_attention_heads=4, num_key_value_heads=2, head_dim=64, intermediate_size=512,
                             mamba_num_heads=8, mamba_head_dim=64, ssm_state_size=64, n_groups=2, chunk_size=64,
                             conv_kernel=4, n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=64,
                             moe_shared_expert_intermediate_size=128, n_group=1, topk_group=1, use_cache=False,
                             pad_token_id=0, eos_token_id=1, bos_token_id=2)
    if kind == "attention":
        c.update(num_attention_heads=p["heads"], num_key_value_heads=p["kv"], head_dim=p["hd"])
    elif kind == "mlp":
        c.update(intermediate_size=p["i"])
    elif kind == "moe":
        c.update(n_routed_experts=p["e"], num_experts_per_tok=p["k"], moe_intermediate_size=p["ie"],
                 moe_shared_expert_intermediate_size=p["si"], moe_latent_size=p["lat"] or None)
    else:
        c.update(mamba_num_heads=p["mh"], mamba_head_dim=p["hd"], ssm_state_size=p["n"], n_groups=p["g"],
                 chunk_size=p["chunk"])
    return c


def real_block_bytes(cfg: dict[str, Any], regime: str, seq: int) -> int:
    """What one layer saves for backward on real CPU tensors: a two-layer model minus a one-layer one."""
    import torch
    import transformers
    from fit_moe_activations import REGIMES as MOE_REGIMES
    from fit_moe_activations import saved_bytes

    def saved(layers: int) -> int:
        hf = transformers.AutoConfig.for_model(**{**cfg, "num_hidden_layers": layers,
                                                  "layer_types": cfg["layer_types"][:layers]})
        torch.manual_seed(0)
        model = transformers.AutoModelForCausalLM.from_config(hf, dtype=getattr(torch, MOE_REGIMES[regime][0])).train()
        ids = torch.randint(0, 512, (BATCH, seq))
        outside = {p.untyped_storage().data_ptr() for p in model.parameters()} | {ids.untyped_storage().data_ptr()}
        return saved_bytes(lambda: model(input_ids=ids, use_cache=False).logits, outside, regime)

    return saved(2) - saved(1)


def slope(kind: str, p: Point, regime: str, path: str) -> float:
    measure: Callable[[int], int]
    if kind == "moe" and regime != "half":
        def measure(seq: int) -> int:
            return real_block_bytes(config(kind, p), regime, seq)
    else:
        def measure(seq: int) -> int:
            return block_bytes(config(kind, p), Setup(micro_batch_size=BATCH, seq_len=seq, optimizer="sgd",
                                                      **REGIMES[regime]))
    with kernels(path, MODEL[kind]):
        short, long = (measure(s) for s in LENGTHS)
    return (long - short) / (BATCH * (LENGTHS[1] - LENGTHS[0]))


def fit_kind(kind: str, path: str = "torch") -> dict[str, Any]:
    out = {}
    for regime in REGIMES:
        ys = [slope(kind, p, regime, path) for p in STEPS[kind]]
        out[regime] = {"per_token": least_squares([dims(kind, p) for p in STEPS[kind]], ys, TERMS[kind])}
        print(f"  {kind}/{path}/{regime}: {json.dumps(out[regime])}", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    import torch
    import transformers

    args = argv if argv is not None else sys.argv[1:]
    dry = "--dry-run" in args
    only = [a for a in args if not a.startswith("--")]
    data = json.loads(DATA.read_text(encoding="utf-8"))
    for kind in only or ("attention", "mlp", "moe", "mamba", "hybrid"):
        model = MODEL[kind]
        table = data["linear_attention"].setdefault(model, {"kinds": {}})
        paths = ("torch", "mamba_ssm") if kind in ("mamba", "hybrid") else ("torch",)
        table["kinds"][kind] = {path: fit_kind(kind, path) for path in paths}
        table["source"] = (
            f"scripts/fit_layer_kinds.py: traces of transformers' {model} layers (torch {torch.__version__}, "
            f"transformers {transformers.__version__}), one kind per model, two layers minus one, batch {BATCH} at "
            f"{LENGTHS[0]} and {LENGTHS[1]} tokens; fake tensors" + (
                ", the MoE kind's fp32 and autocast regimes on real CPU tensors (grouped_mm's fake kernel refuses fp32)"
                if model == "nemotron_h" else "") +
            "; the Mamba-2 mixer on the reference code (torch) and on a stand-in saving what mamba-ssm's "
            f"MambaSplitConv1dScanCombinedFn saves (mamba_ssm). Block code: transformers/models/{model}/modeling_{model}.py.")
    write_data(data, dry)
    return 0


if __name__ == "__main__":
    sys.exit(main())
