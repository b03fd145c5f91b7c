"""Trace the live bytes inside one recomputed decoder block's backward (memory/block_backward.py).

Run: ``HF_HUB_OFFLINE=1 .venv/bin/python scripts/trace_block_backward.py [--arch=A] [CASE ...]`` (``--arch``:
trace_models.ARCHS; the cases: trace_models.CASES or FULL_CASES, default the three LoRA ones priced).
Real CPU tensors: a random-init Mistral-shaped Llama (GQA 4:1, FFN 3.5 x hidden, three blocks) saved and reloaded
through transformers' bitsandbytes integration (nf4, double quant, bf16 compute), prepared with peft's prepare_model_for_kbit_training
(fp32 embeddings, norms and head: the hidden stream is fp32), LoRA on all seven Linears, bf16 autocast, gradient
checkpointing with ``use_reentrant=True`` (transformers 4.35-4.4x's default) and False (the current one). The 16-bit
case is the same model in bf16 without the kbit preparation. perfguide's live-bytes tracker (tracing/tracker.py)
counts every storage an op returns until Python frees it. A forward pre-hook on the middle block notes the live
bytes when autograd starts to recompute it (the baseline), a forward hook when the recompute ends; the peak until
the next block's recompute starts is the block's backward. Printed per token (two lengths, differenced, so the
dequantized weights and other length-free transients drop out) and per FFN unit (two FFN widths, differenced):
what the recompute saves (``saved_tensors_hooks``) and how far the backward rises above it (``in flight``).

``--compare [--bnb-keeps-inputs]`` prints, per case and reentrant, the live bytes as the recompute starts, the saved
bytes and the rise, each per FFN unit and per hidden unit, for the releases installed in the venv that runs it: run
it under a venv with transformers 4.39.3 + peft 0.10.0 and under this one to set the April-2024 QLoRA stack beside
the current one (docs/validation.md section 19; tests/test_mistral_fa2_repeat_kv.py).

``--liger`` traces the fp32-stream and bf16-autocast cases with the blocks patched as liger-kernel patches a Llama
instance (monkey_patch ``apply_liger_kernel_to_llama(model=...)``, what ``use_liger_kernel=True`` runs: every
decoder MLP's forward becomes ``down_proj(LigerSiLUMulFunction(gate_proj(x), up_proj(x)))`` and every RMSNorm's
forward ``LigerRMSNormFunction``). Triton does not run on CPU, so scripts/liger_standins.py stands in for the two
kernels with their storage semantics (liger-kernel 0.8.5 ops/swiglu.py, ops/rms_norm.py; that module says which).

``--saved`` sets, per case, the live bytes as the recompute ends (the mark stop 35's in-flight terms were measured
from) beside the storages the recompute saves for backward (``saved_tensors_hooks``: the reference the in-flight
terms are measured from now) and what activations.layer_bytes prices.

``--full`` traces full fine-tuning (FULL_CASES: no adapter, every weight trainable; bf16 or fp32 weights, with and
without bf16 autocast), HF's modules and the Liger stand-ins (the RMSNorm's weight gradient then accumulates in one
fp32 row, length-free as the kernel's per-program rows are), both checkpoint variants, first with every ``.grad``
None (a first micro-step) and then with every ``.grad`` there (a later accumulation micro-step), and prints the
per-token coefficients and the length-free rest (memory/block_backward.py ``full_finetune_per_token``).
"""

from __future__ import annotations

import os
import sys
import tempfile
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from trace_models import FULL_CASES, decoder, keep_4bit_inputs, traced

#: where the last traced backward peaked: the autograd node running (``node``: its name, or "" outside a node's
#: backward, as the recompute runs) and the op that made the peak's storage (``op``)
PEAK_AT: dict[str, str] = {}
#: set to a list to record, for every op the traced window runs, (the autograd node running, live bytes after it)
PROFILE: list[tuple[str, int]] | None = None


def block_backward(model: Any, seq: int, autocast: bool) -> tuple[int, int]:
    """(bytes the middle block's recompute keeps, peak of its backward) above the live bytes as its recompute starts."""
    start, saved, peak, _ = block_marks(model, seq, autocast)
    return saved - start, peak - start


def block_marks(model: Any, seq: int, autocast: bool, accumulate: bool = False) -> tuple[int, int, int, int]:
    """Live bytes as the middle block's recompute starts, as it ends, the peak of its backward, and the bytes of the
    storages its recompute saves for backward (``saved_tensors_hooks``; parameters and the rotary cos / sin left out,
    storages alive before the recompute, such as the block's input an fp32 norm saves, counted: what
    activations.layer_bytes prices).
    The recompute's end holds more than it saves: the tensors the block's forward still references there (16-bit:
    the attention's residual sum and the MLP output, 4 B per hidden unit per token), which its backward frees.
    ``accumulate``: one untracked step first, so every ``.grad`` exists and the traced backward adds into it (a later
    micro-step of gradient accumulation); else the gradients are None (set_to_none, the first micro-step)."""
    import torch

    if not accumulate:
        model.zero_grad(set_to_none=True)
    else:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            ids = torch.randint(0, 256, (1, seq))
            model(input_ids=ids, labels=ids).loss.backward()

    from perfguide.memory.tracing.tracker import make_tracker

    tracker = make_tracker(1)
    layers = decoder(model).layers
    marks: dict[str, int] = {}
    state = {"backward": False, "peak": 0, "open": False}

    def pre(module: Any, args: Any) -> None:
        if state["backward"]:
            if module is layers[1].input_layernorm:
                marks["start"], state["open"], state["peak"] = tracker.total, True, tracker.total
            elif module is layers[0].input_layernorm:
                state["open"] = False

    def post(module: Any, args: Any, out: Any) -> None:
        if state["backward"]:
            marks["saved"] = tracker.total

    # the checkpointed layer's own hooks do not fire on recompute (GradientCheckpointingLayer re-runs its forward);
    # its first submodule's (the input norm) and last one's (the MLP) do
    ffn = getattr(layers[1], "block_sparse_moe", None) or layers[1].mlp   # transformers 4.x Mixtral names its MoE block so
    handles = [m.input_layernorm.register_forward_pre_hook(pre) for m in layers] + [ffn.register_forward_hook(post)]
    cls = type(tracker)
    original = cls.__torch_dispatch__

    def dispatch(self: Any, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = original(self, func, types, args, kwargs)
        if state["open"]:
            node = torch._C._current_autograd_node()
            name = "" if node is None else node.name()
            if PROFILE is not None:
                PROFILE.append((name, self.total))
            if self.total > state["peak"]:
                state["peak"] = self.total
                PEAK_AT.update(node=name, op=str(func))
        return out

    cls.__torch_dispatch__ = dispatch  # type: ignore[method-assign]
    # not the block's: the parameters, and the rotary cos / sin every block is handed (computed once per forward)
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved: dict[int, int] = {}

    def shared(module: Any, args: Any, kwargs: Any) -> None:
        params.update(t.untyped_storage().data_ptr() for t in kwargs.get("position_embeddings") or ())

    handles.append(layers[1].self_attn.register_forward_pre_hook(shared, with_kwargs=True))

    def pack(t: Any) -> Any:
        storage = t.untyped_storage()
        if state["open"] and storage.data_ptr() not in params:
            saved[storage.data_ptr()] = storage.nbytes()
        return t

    ids = torch.randint(0, 256, (1, seq))
    try:
        with tracker, torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            for param in model.parameters():   # the tracker counts a storage when an op first returns it: the
                if param.grad is not None:     # accumulating add_ would charge a gradient that existed all along
                    tracker.charge(param.grad)
            loss = model(input_ids=ids, labels=ids).loss
            state["backward"] = True
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                loss.backward()
    finally:
        cls.__torch_dispatch__ = original  # type: ignore[method-assign]
        for handle in handles:
            handle.remove()
    # non-reentrant checkpointing stops recomputing once the tensors backward needs exist (torch's early stop), so the
    # MLP hook may not fire: then only the peak is known
    return marks["start"], marks.get("saved", marks["start"]), state["peak"], sum(saved.values())


def per_token(case: str, h: int, i: int, reentrant: bool, s1: int = 256, s2: int = 512,
              liger: bool = False, accumulate: bool = False) -> tuple[float, float]:
    """(saved, peak) bytes per token of the middle block's backward above the live bytes as its recompute starts,
    differenced over two lengths; ``saved`` is the live bytes as the recompute ends (block_marks)."""
    _, saved, peak, _ = per_token_marks(case, h, i, reentrant, s1, s2, liger=liger, accumulate=accumulate)
    return saved, peak


def per_token_marks(case: str, h: int, i: int, reentrant: bool, s1: int = 256, s2: int = 512,
                    keep_inputs: bool = False, liger: bool = False, accumulate: bool = False,
                    arch: str = "llama", dims: dict[str, Any] | None = None) -> tuple[float, float, float, float]:
    """Bytes per token (two lengths differenced): live as the middle block's recompute starts (every block input,
    the gradients already in flight), then the recompute's saved tensors and its backward's peak above that start.
    ``keep_inputs``: bitsandbytes before 0.43.2's MatMul4Bit (keep_4bit_inputs); ``liger``: liger-kernel's patch;
    ``accumulate``: the gradients already exist (block_marks); ``arch``, ``dims``: trace_models.model_config's."""
    undo = keep_4bit_inputs() if keep_inputs else None
    try:
        with tempfile.TemporaryDirectory() as tmp:
            model, autocast = traced(case, h, i, reentrant, tmp, liger, arch, dims)
            (a1, k1, p1, t1), (a2, k2, p2, t2) = (block_marks(model, s, autocast, accumulate) for s in (s1, s2))
    finally:
        if undo is not None:
            undo()
    ds = s2 - s1
    return (a2 - a1) / ds, ((k2 - a2) - (k1 - a1)) / ds, ((p2 - a2) - (p1 - a1)) / ds, (t2 - t1) / ds


def decomposed(case: str, keep_inputs: bool = False, h: int = 64, i1: int = 224, i2: int = 448,
               liger: bool = False) -> dict[str, dict[str, float]]:
    """Reentrant checkpointing (the April-2024 default), per token: the live bytes as the block's recompute starts,
    its saved tensors and its backward's rise above them, each split per FFN unit ("i", two widths differenced) and
    per hidden unit ("h", the rest at q = h, kv = h / 4), to set one stack's trace beside another's."""
    one, two = (per_token_marks(case, h, i, True, keep_inputs=keep_inputs, liger=liger) for i in (i1, i2))
    parts = {"between": (one[0], two[0]), "saved": (one[1], two[1]), "in_flight": (one[2] - one[1], two[2] - two[1])}
    out = {}
    for name, (x1, x2) in parts.items():
        per_i = (x2 - x1) / (i2 - i1)
        out[name] = {"i": round(per_i, 2), "h": round((x1 - per_i * i1) / h, 2)}
    return out


def coefficients(case: str, reentrant: bool, h: int = 64, i1: int = 224, i2: int = 448,
                 liger: bool = False, accumulate: bool = False, arch: str = "llama") -> dict[str, float]:
    """Bytes per token the backward holds beyond the storages the recompute saves (reentrant's: non-reentrant recomputes
    the same ones; what activations.layer_bytes prices, so that the two add up to the block's peak), per FFN unit
    ("i", two widths differenced) and per hidden unit ("h", the rest at q = h, kv = h / 4). Stop 35's coefficients
    were above the live bytes as the recompute ends instead, which also hold what the block's forward still
    references there and does not save (block_marks, ``--saved``: 6 B per hidden unit per token for LoRA on a 16-bit
    base, 4 in the fp32 stream and for a 16-bit full fine-tune, 2 for fp32 weights under autocast, 0 in fp32)."""
    saved1, saved2 = (per_token_marks(case, h, i, True, liger=liger, accumulate=accumulate, arch=arch)[3] for i in (i1, i2))
    peak1, peak2 = (per_token_marks(case, h, i, reentrant, liger=liger, accumulate=accumulate, arch=arch)[2] for i in (i1, i2))
    per_i = ((peak2 - saved2) - (peak1 - saved1)) / (i2 - i1)
    return {"i": round(per_i, 2), "h": round(((peak1 - saved1) - per_i * i1) / h, 2)}


def compare() -> int:
    """``--compare [--bnb-keeps-inputs]``: the decomposition of every nf4/bf16 autocast case under the installed
    releases, for a trace of the April-2024 stack (a separate venv with transformers 4.39.3 and peft 0.10.0) to set
    beside the installed one's."""
    import bitsandbytes
    import peft
    import transformers

    keep = "--bnb-keeps-inputs" in sys.argv
    print(f"transformers {transformers.__version__}, peft {peft.__version__}, bitsandbytes {bitsandbytes.__version__}"
          f"{' with MatMul4Bit keeping its input (before 0.43.2)' if keep else ''}; reentrant; bytes per token")
    for case in ("fp32_stream", "nf4_half_stream", "half_autocast"):
        print(case, decomposed(case, keep))
        sys.stdout.flush()
    return 0


def liger_main() -> int:
    """``--liger``: per case, HF's modules beside liger-kernel's (reentrant: saved and in flight, per FFN unit / per
    hidden unit), then Liger's in-flight coefficients for both checkpoint variants."""
    for case in ("fp32_stream", "half_autocast"):
        for liger in (False, True):
            print(case, "liger" if liger else "hf", decomposed(case, liger=liger))
            sys.stdout.flush()
        for reentrant in (True, False):
            print(case, f"liger reentrant={reentrant}: in flight per token", coefficients(case, reentrant, liger=True))
            sys.stdout.flush()
    return 0


def length_free(case: str, reentrant: bool, coef: dict[str, float], accumulate: bool, liger: bool = False,
                h: int = 64, i: int = 224, s: int = 256) -> int:
    """Bytes the backward holds above the recompute's saved tensors at one length, less the per-token terms: what
    does not grow with the sequence (for a full fine-tune, the block's weight gradients as they land)."""
    with tempfile.TemporaryDirectory() as tmp:
        marks = {}
        for mode in {True, reentrant}:
            model, autocast = traced(case, h, i, mode, tmp, liger)
            marks[mode] = block_marks(model, s, autocast, accumulate)
    saved = marks[True][3]
    start, _, peak, _ = marks[reentrant]
    return round(peak - start - saved - (coef["i"] * i + coef["h"] * h) * s)


def full_main() -> int:
    """``--full``: full fine-tuning (every weight trainable), HF's MLP and Liger's stand-ins, both checkpoint
    variants: the per-token coefficients, then the length-free rest on a first micro-step (.grad None) and on an
    accumulating one, beside the down_proj weight gradient (h x i elements in the weights' dtype)."""
    h, i = 64, 224
    for case, (weights, _) in FULL_CASES.items():
        grad = h * i * (4 if weights == "fp32" else 2)
        for liger in (False, True):
            for reentrant in (True, False):
                coef = coefficients(case, reentrant, liger=liger)
                rest = [length_free(case, reentrant, coef, acc, liger) for acc in (False, True)]
                print(f"{case} {'liger' if liger else 'hf'} reentrant={reentrant}: in flight per token {coef}; length-free "
                      f"{rest[0]} B first micro-step, {rest[1]} B accumulating (down_proj's gradient {grad} B)")
                sys.stdout.flush()
    return 0


def saved_main() -> int:
    """``--saved``: per case (reentrant, h 128, FFN 448, q = h, kv = h / 4), bytes per token: the live bytes as the
    middle block's recompute ends (the mark stop 35's in-flight terms were measured from), the storages the
    recompute saves for backward (the reference they are measured from now), and what activations.layer_bytes (+ lora_layer_bytes) prices for that block (CUDA's SDPA kernel emulated, so fp32
    attention differs: CPU's kernel keeps grouped K/V, CUDA's memory-efficient one expanded ones, and the priced
    16-bit logsumexp term was fitted at head_dim 16, not 32). Mark minus saved is what the block's forward still
    references at its end without saving it (the residual sum, the norm output, the MLP output)."""
    from perfguide.memory.activations import layer_bytes
    from perfguide.memory.ledger import ledger
    from perfguide.memory.lora_activations import lora_layer_bytes
    from perfguide.model.types import ModelSpec
    from perfguide.setup import LoraSpec, Setup

    h, i, seq = 128, 448, 1024
    spec = ModelSpec.from_any({"model_type": "llama", "hidden_size": h, "intermediate_size": i, "num_attention_heads": 4,
                               "num_key_value_heads": 1, "head_dim": h // 4, "num_hidden_layers": 3, "vocab_size": 256,
                               "max_position_embeddings": 4096, "tie_word_embeddings": False})
    lora = LoraSpec(r=8, alpha=16, target_modules=("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"))
    setups: dict[str, dict[str, Any]] = {"fp32_stream": dict(weights_dtype="nf4", autocast="bf16", kbit_upcast=True, lora=lora),
              "half_autocast": dict(weights_dtype="bf16", autocast="bf16", lora=lora), "half": dict(weights_dtype="bf16", lora=lora),
              "full_half": dict(weights_dtype="bf16"), "full_half_autocast": dict(weights_dtype="bf16", autocast="bf16"),
              "full_fp32_autocast": dict(weights_dtype="fp32", autocast="bf16"), "full_fp32": dict(weights_dtype="fp32")}
    for case, kw in setups.items():
        _, mark, _, saved = per_token_marks(case, h, i, True)
        setup = Setup(micro_batch_size=1, seq_len=seq, optimizer="sgd", gradient_checkpointing=True, **kw)
        led = ledger(spec, setup)   # the adapters' inputs and rank-wide outputs, as analytic.training_memory adds them
        priced = (layer_bytes(spec, setup) + lora_layer_bytes(setup, led.lora_inputs_per_layer, led.lora_rank_per_layer)) / seq
        print(f"{case}: mark {mark:.0f}, saved tensors {saved:.0f} (mark - saved {mark - saved:+.0f} = {(mark - saved) / h:+.2f} B "
              f"per hidden unit), priced {priced:.0f} B per token")
        sys.stdout.flush()
    return 0


def main() -> int:
    if "--saved" in sys.argv:
        return saved_main()
    if "--compare" in sys.argv:
        return compare()
    if "--liger" in sys.argv:
        return liger_main()
    if "--full" in sys.argv:
        return full_main()
    arch = next((a.removeprefix("--arch=") for a in sys.argv if a.startswith("--arch=")), "llama")
    for case in tuple(a for a in sys.argv[1:] if not a.startswith("--")) or ("fp32_stream", "half_autocast", "half"):
        for reentrant in (True, False):
            coef = coefficients(case, reentrant, arch=arch)
            saved = per_token_marks(case, 128, 448, True, arch=arch)[3]
            peak = per_token_marks(case, 128, 448, reentrant, arch=arch)[2]
            check = coef["i"] * 448 + coef["h"] * 128
            print(f"{case} reentrant={reentrant}: in flight per token {coef}; at h 128, i 448: measured "
                  f"{peak - saved:.0f} B, the coefficients give {check:.0f} B (saved {saved:.0f}, peak {peak:.0f})")
            sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
