"""Trace one recomputed Mixtral block of the fms-acceleration QLoRA rows (bench rows 1301-1304) under the installed
transformers release: what its recompute saves and how far its backward rises above that (data/activations.json
``block_backward.expert_loop``, memory/block_backward.py ``expert_loop_per_token``).

Run: ``HF_HUB_OFFLINE=1 PYTHONPATH=. VENV/bin/python scripts/trace_moe_block.py [fp32_stream] [half_autocast]`` in a
venv with the release to trace (the rows ran transformers 4.48.1 + peft 0.13.2: ``python3 -m venv /tmp/v448 &&
/tmp/v448/bin/pip install torch==2.13.0 transformers==4.48.1 peft==0.13.2 accelerate==1.0.1 bitsandbytes==0.50.2
pydantic``, then ``pip install --no-deps trl==0.13.0``). In this repository's venv (transformers 5, grouped_mm) only
``half_autocast`` runs: TRL 0.22 dropped the recast the fp32_stream case applies.

The rows' setup, on real CPU tensors: a random-init three-block Mixtral (hidden 64, q = h, kv = h / 4, 8 experts,
top-2) in nf4 (double quant, bf16 compute; trace_models.quantize_nf4 where the release's loader wants CUDA).
fp32_stream (the single-GPU rows): peft's prepare_model_for_kbit_training (fp32 norms, embeddings and head, gradient
checkpointing with ``use_reentrant=True``: what torch 2.4 ran for the ``{}`` kwargs TRL 0.13 hands peft), LoRA r 16 /
alpha 16 / dropout 0.1 on q, k, v, o, then TRL 0.13's ``peft_module_casting_to_bf16`` (its source text, read from the
installed trl: norms fp32, embeddings and head bf16, the adapters left fp32: 0.8.6 still re-cast every tuner layer,
0.9.2 on do not). half_autocast (the FSDP rows): neither preparation nor recast, bf16 norms and stream. bf16 autocast.
trace_block_backward.block_marks measures the middle block: the storages its recompute saves (``saved_tensors_hooks``)
and the peak of its backward above them. Printed: the saved bytes per routed expert unit (two expert widths
differenced), the saved storages one expert's tokens x hidden wide per routed hidden unit (the expert's output and
the weighted product index_add_ keeps), the rise at expert width 448 against the hand count of the loop's last expert (the first backward
reaches: transformers 4 runs ``for expert_idx in range(self.num_experts)``, so backward holds one expert's gradients
at a time), and the rise at expert width 16, where the block peaks outside the experts (two lengths differenced).
Every parameter but the experts' comes from one seed and the experts' output is scaled down, so both widths route
block 1's tokens alike (the printed loads).
"""

from __future__ import annotations

import ast
import os
import sys
import tempfile
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from trace_models import dtype_keyword, quantize_nf4

H, EXPERTS, TOP_K, LAYERS = 64, 8, 2, 3
WIDTHS = (224, 448)
LENGTHS = (512, 1024)
ROUTER_SEEDS = (0, 1)
#: the single-GPU rows (peft kbit preparation, TRL recast: fp32 stream) and the FSDP ones (neither: bf16 stream)
CASES = ("fp32_stream", "half_autocast")
#: bytes per expert FFN unit at the gated product's backward: its gradient and its two factors' (fp32 / bf16)
HAND_COUNT = {"fp32_stream": 12, "half_autocast": 6}
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj"]


def trl_recast() -> Any:
    """TRL 0.13's ``peft_module_casting_to_bf16``, from the installed trl's source text (trl/trainer/utils.py imports
    datasets, which the trace venv need not have; the function itself uses torch only)."""
    import importlib.util

    import torch

    spec = importlib.util.find_spec("trl")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("trl is not installed in this venv: pip install --no-deps trl==0.13.0 (the rows' release)")
    path = os.path.join(next(iter(spec.submodule_search_locations)), "trainer", "utils.py")
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    node = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "peft_module_casting_to_bf16"), None)
    if node is None:   # TRL 0.22 dropped it: a current venv traces half_autocast only
        raise SystemExit(f"{path} has no peft_module_casting_to_bf16 (TRL 0.7.5-0.21 have it): trace half_autocast here")
    scope: dict[str, Any] = {"torch": torch}
    exec(compile(ast.Module(body=[node], type_ignores=[]), path, "exec"), scope)
    return scope["peft_module_casting_to_bf16"]


def build(width: int, tmp: str, router_seed: int, case: str = "fp32_stream") -> Any:
    """The rows' model at expert width ``width`` (module docstring). Every parameter but the experts' is drawn from
    ``router_seed`` alone and the experts' down projections are scaled by 1e-4, so block 0's experts (whose weights
    depend on the width) barely move the stream and both widths route block 1's tokens alike: their difference is the
    experts' own."""
    import torch
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig, MixtralConfig

    torch.manual_seed(0)
    config = MixtralConfig(hidden_size=H, intermediate_size=width, num_attention_heads=4, num_key_value_heads=1,
                           head_dim=H // 4, num_hidden_layers=LAYERS, vocab_size=256, max_position_embeddings=4096,
                           num_local_experts=EXPERTS, num_experts_per_tok=TOP_K, tie_word_embeddings=False)
    model = AutoModelForCausalLM.from_config(config)
    torch.manual_seed(router_seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if ".experts." not in name:
                param.normal_(0, 0.02 if param.dim() > 1 else 0.0).add_(0 if param.dim() > 1 else 1)
            elif ".w2." in name or name.endswith("experts.down_proj"):   # the experts' output barely moves the stream, so the width leaves block 1's routing
                param.mul_(1e-4)
    model.save_pretrained(tmp)
    kwargs: dict[str, Any] = {"attn_implementation": "sdpa", dtype_keyword(): torch.bfloat16,
                              "quantization_config": BitsAndBytesConfig(
                                  load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                                  bnb_4bit_compute_dtype=torch.bfloat16)}
    try:
        model = AutoModelForCausalLM.from_pretrained(tmp, **kwargs)
    except (ImportError, RuntimeError, AttributeError):   # a release whose bnb quantizer wants CUDA (4.48: a frozenset it edits)
        kwargs.pop("quantization_config")
        model = quantize_nf4(AutoModelForCausalLM.from_pretrained(tmp, **kwargs))
    lora = LoraConfig(r=16, lora_alpha=16, lora_dropout=0.1, target_modules=TARGETS)
    if case == "fp32_stream":
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=True,
                                                gradient_checkpointing_kwargs={"use_reentrant": True})
        model = get_peft_model(model, lora)
        trl_recast()(model)
    else:   # the FSDP rows: TRL 0.13 finds the weights off the GPU and skips both (bf16 norms and stream)
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
        model.enable_input_require_grads()
        model = get_peft_model(model, lora, autocast_adapter_dtype=False)
    return model.train()


def routing(model: Any, seq: int) -> list[int]:
    """Tokens each expert of the middle block takes at ``seq`` tokens (its router on the same input as the trace)."""
    import torch
    from trace_models import decoder

    layer = decoder(model).layers[1]
    moe = getattr(layer, "block_sparse_moe", None) or layer.mlp
    got: list[Any] = []
    handle = moe.gate.register_forward_hook(lambda m, a, out: got.append(out[0] if isinstance(out, tuple) else out))
    torch.manual_seed(1)
    ids = torch.randint(0, 256, (1, seq))
    try:
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            model(input_ids=ids)
    finally:
        handle.remove()
    top = torch.topk(got[0].float(), TOP_K, dim=-1).indices.flatten()
    return [int((top == e).sum()) for e in range(EXPERTS)]


def marks(model: Any, seq: int) -> tuple[int, int, int]:
    """(live bytes as the middle block's recompute starts, its backward's peak, bytes its recompute saves)."""
    import torch
    from trace_block_backward import block_marks

    torch.manual_seed(1)   # the same input ids as routing()
    start, _, peak, saved = block_marks(model, seq, True)
    return start, peak, saved


def rise(case: str, width: int, seed: int, seq: int) -> tuple[int, int, list[int]]:
    """(bytes the middle block's backward rises above its recompute's saved tensors, those saved bytes, its expert
    loads) at one width, router seed and length."""
    with tempfile.TemporaryDirectory() as tmp:
        model = build(width, tmp, seed, case)
        start, peak, saved = marks(model, seq)
        return peak - start - saved, saved, routing(model, seq)


def routed_copies(case: str, seq: int) -> float:
    """Bytes per routed hidden unit per token of the storages the middle block's recompute saves that are one expert's
    tokens x hidden (the expert's output and the weighted product, per expert), at expert width 224."""
    import torch
    from trace_models import decoder

    with tempfile.TemporaryDirectory() as tmp:
        model = build(WIDTHS[0], tmp, 0, case)
        layer = decoder(model).layers[1]
        params = {p.untyped_storage().data_ptr() for p in model.parameters()}
        state, found = {"in": False}, {}
        handles = [layer.register_forward_pre_hook(lambda m, a: state.update(on=True)),
                   layer.register_forward_hook(lambda m, a, o: state.update(on=False))]

        def pack(t: Any) -> Any:
            ptr = t.untyped_storage().data_ptr()
            if state.get("on") and ptr not in params and t.dim() == 2 and t.shape[1] == H and t.shape[0] < seq:
                found[ptr] = t.untyped_storage().nbytes()
            return t

        torch.manual_seed(1)
        ids = torch.randint(0, 256, (1, seq))
        try:
            with torch.autocast("cpu", dtype=torch.bfloat16), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                model(input_ids=ids, labels=ids).loss.backward()   # reentrant: the layer's hooks fire on its recompute
        finally:
            for handle in handles:
                handle.remove()
    return sum(found.values()) / (seq * TOP_K * H)


def main() -> int:
    """Per case: the saved bytes per routed expert unit; the expert peak against the hand count (HAND_COUNT B per
    unit of the loop's last expert's width per token it takes: its gated product's gradient and its two factors');
    the hidden-unit rest where the block peaks outside the experts (expert width 16, two lengths, two routers)."""
    import peft
    import torch
    import transformers

    print(f"transformers {transformers.__version__}, peft {peft.__version__}, torch {torch.__version__}; "
          f"h {H}, {EXPERTS} experts, top-{TOP_K}")
    cases = [a for a in sys.argv[1:] if a in CASES] or list(CASES)
    for case in cases:
        seq = LENGTHS[1]
        (_, k1, loads), (r2, k2, _) = (rise(case, w, 0, seq) for w in WIDTHS)
        per_unit = (k2 - k1) / (WIDTHS[1] - WIDTHS[0]) / seq / TOP_K
        last = loads[-1]
        hand = HAND_COUNT[case] * WIDTHS[1] * last
        print(f"{case}: saved {per_unit:.2f} B per routed expert unit per token; width {WIDTHS[1]}, {seq} tokens, "
              f"loads {loads}: backward {r2} B above saved, hand count {HAND_COUNT[case]} x {WIDTHS[1]} x {last} = {hand} "
              f"(expert_h {(r2 - hand) / seq / H:+.2f} B per hidden unit per token)", flush=True)
        print(f"  routed copies saved: {routed_copies(case, seq):.2f} B per routed hidden unit per token", flush=True)
        for seed in ROUTER_SEEDS:
            (a, _, _), (b, _, _) = (rise(case, 16, seed, s) for s in LENGTHS)
            print(f"  expert width 16, router seed {seed}: rest_h {(b - a) / (LENGTHS[1] - LENGTHS[0]) / H:.2f} B per hidden "
                  f"unit per token", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
