"""Reserved bytes of a long-context QLoRA step of the April-2024 stack, read by replaying the caching allocator
(scripts/caching_allocator.py) over the step's own order of tensor allocations and frees. Two cases (CASES):
``llamafactory`` (bench rows 1000-1005: Llama-2-7B, nf4, LoRA r 8 on all seven Linears, fp16, FlashAttention-2,
reentrant checkpointing, batch 1, LLaMA-Factory's own preparation: 16-bit norms, embedding and head) and
``unsloth_mistral`` (rows 1009-1015, Unsloth's "Hugging Face + FA2" baseline: Mistral-7B's shape, LoRA r 32, bf16,
peft's prepare_model_for_kbit_training: every non-quantized weight in fp32, so the stream is fp32 and each
Linear4bit returns fp32).

The step runs on fake tensors at the model's real shape (32 x 4096, FFN 11008, vocabulary 32,000) and the row's real
length, so every request has its real size; the installed transformers' Llama modules run, with what the April-2024
stack did differently put back where it changes a request:

* transformers 4.39.3's head and loss (LlamaForCausalLM.forward): ``logits = logits.float()`` on the head's fp16
  output (here a forward hook on lm_head, so the fp16 block is freed and the returned logits are fp32, as there),
  then ``logits[..., :-1, :].contiguous()`` and CrossEntropyLoss on it;
* peft 0.10.0's bnb Linear4bit.forward: ``result = self.base_layer(x); result = result.clone()``;
* bitsandbytes 0.43.1's MatMul4Bit: the weight dequantized to fp16 for the matmul in forward and again in backward
  (a weight-sized transient each time), the input kept on the node (``ctx.tensors = (A, B)``);
* bitsandbytes' Linear4bit.forward returns ``out.to(inp_dtype)`` (fp32 in an fp32 stream, a no-op at 16 bits);
* LLaMA-Factory 0.6.x: gradient checkpointing with use_reentrant=True and enable_input_require_grads, the LoRA
  weights cast to fp32 (model/adapter.py), fp16 autocast (Trainer fp16), FA2 (here the CUDA flash kernel's
  aten op through perfguide's CUDA emulation: output and log-sum-exp); peft's kbit preparation for the Unsloth case
  (the same checkpointing; Mistral's 4.39.3 FA2 repeats the grouped keys and values inside the recomputed block,
  not run here: 12 KB per token in one block).

Weights, LoRA gradients of the earlier micro-steps and AdamW's states exist before the step and sit in their own
blocks; the replay covers what the step allocates: forward, loss, backward, and the optimizer step. Steps repeat
(the same requests each micro-step), so the replay runs the event list several times and reports the reserved
bytes the run settles at. Prints GiB: peak allocated and reserved of the step's own tensors, and their ratio.

It also runs under the rows' own releases: ``pip install --no-deps --target DIR transformers==4.39.3 peft==0.10.0
tokenizers==0.15.2 huggingface_hub==0.22.2 accelerate==0.28.0 requests`` and DIR first on PYTHONPATH (4.39.3's
sdpa attention, its s x s mask builder switched off as FA2 builds none for an unpadded batch; docs/validation.md 25).

Usage: python scripts/trace_allocator_replay.py [--case NAME] [--write] [SEQ ...]   (default: the rows' lengths 1024 ... 32768;
``--write``, llamafactory case only: into bench/data/allocator_replays.csv, which bench/accuracy_replay.py reads)
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from allocation_log import AllocationLog
from caching_allocator import Allocator

GiB = 2**30
LENGTHS = (1024, 2048, 4096, 8192, 16384, 32768)
#: the op, shape and dtype that made each event's storage (for reading a replay)
OPS: dict[int, tuple[str, tuple[int, ...], str]] = {}
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


#: (key/value heads, FFN width, LoRA rank, autocast dtype, every weight fp32 (peft's kbit preparation), rope theta,
#: positions): meta-llama/Llama-2-7b-hf and mistralai/Mistral-7B-v0.2 config.json, the rows' LoRA ranks and precisions
CASES: dict[str, tuple[int, int, int, str, bool, float, int]] = {
    "llamafactory": (32, 11008, 8, "float16", False, 10000.0, 4096),
    "unsloth_mistral": (8, 14336, 32, "bfloat16", True, 1e6, 32768),
}


def model_config(case: str, layers: int = 32) -> Any:
    from transformers import LlamaConfig

    kv, ffn, _, _, _, theta, positions = CASES[case]
    return LlamaConfig(hidden_size=4096, intermediate_size=ffn, num_attention_heads=32, num_key_value_heads=kv,
                       num_hidden_layers=layers, vocab_size=32000, max_position_embeddings=positions, rms_norm_eps=1e-5,
                       rope_theta=theta, tie_word_embeddings=False)


def loss_439(logits: Any, labels: Any, vocab_size: int, **_: Any) -> Any:
    """transformers 4.39.3 LlamaForCausalLM.forward's loss on already-upcast logits."""
    import torch

    shift_logits = logits[..., :-1, :].contiguous()
    shift_labels = labels[..., 1:].contiguous()
    return torch.nn.CrossEntropyLoss()(shift_logits.view(-1, vocab_size), shift_labels.view(-1))


def matmul_4bit() -> Any:
    """bitsandbytes 0.43.1 MatMul4Bit's storage behaviour on a frozen weight: dequantize (fp16, weight-sized) for the
    forward matmul and again for the input gradient; ``ctx.tensors = (A, B)`` keeps the input on the node."""
    import torch

    class MatMul4Bit(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, a: Any, shape: tuple[int, int]) -> Any:
            w = torch.empty(shape, dtype=a.dtype)          # F.dequantize_4bit(B, state).to(A.dtype)
            out = torch.nn.functional.linear(a, w).to(a.dtype)   # Linear4bit.forward: out.to(inp_dtype)
            del w
            ctx.kept = a
            ctx.shape = shape
            return out

        @staticmethod
        def backward(ctx: Any, grad: Any) -> Any:
            w = torch.empty(ctx.shape, dtype=grad.dtype)
            return (grad @ w).to(grad.dtype), None

    return MatMul4Bit


def quantized_forward(fn: Any, layer: Any) -> Any:
    shape = (layer.out_features, layer.in_features)

    def forward(x: Any) -> Any:
        return fn.apply(x, shape)
    return forward


def lora_forward(module: Any, clone: bool) -> Any:
    """peft 0.10.0's bnb Linear4bit.forward under autocast: the base output cloned ("As per Tim Dettmers, for 4bit,
    we need to defensively clone here"), the adapters' input not cast (``requires_conversion = not
    torch.is_autocast_enabled()``: autocast is on in a real run, emulated here), their output added."""
    def forward(x: Any, *args: Any, **kwargs: Any) -> Any:
        result = module.base_layer(x, *args, **kwargs)
        if clone:
            result = result.clone()
        for name in module.active_adapters:
            result = result + module.lora_B[name](module.lora_A[name](module.lora_dropout[name](x))) * module.scaling[name]
        return result
    return forward


def build(case: str, layers: int) -> tuple[Any, Any]:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaForCausalLM, __version__

    from perfguide.memory.loss_path import version_tuple

    # from_pretrained's dtype keyword: ``torch_dtype`` before transformers 4.56 (4.39.3, when run under that release)
    key = "dtype" if version_tuple(__version__) >= version_tuple("4.56.0") else "torch_dtype"
    with torch.device("meta"):
        model = LlamaForCausalLM._from_config(model_config(case, layers), attn_implementation="sdpa",
                                              **{key: getattr(torch, CASES[case][3])})
    if hasattr(model.model, "_update_causal_mask"):
        # 4.3x's sdpa path builds an s x s mask the FA2 runs never hold (4.39's FA2 path returns None unpadded); None
        # makes its sdpa call is_causal=True, as the installed release does for an unpadded batch
        model.model._update_causal_mask = lambda *args, **kwargs: None
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
    model.enable_input_require_grads()
    model = get_peft_model(model, LoraConfig(r=CASES[case][2], lora_alpha=16, lora_dropout=0.0, target_modules=TARGETS))
    model.train()
    return model, model.get_base_model()


def events_of_step(seq: int, layers: int = 32, clone: bool = True, dequant: bool = True,
                   case: str = "llamafactory") -> tuple[list[tuple[str, int, int]], int]:
    """The step's allocation events in order, and the bytes that existed before it (weights, grads, states).
    ``clone`` / ``dequant``: put back peft 0.10.0's clone / bitsandbytes' dequantized weight (off: to see what each
    changes)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from perfguide.memory.tracing.cuda_emulation import make_cuda_emulation, make_scalar_fallback
    from perfguide.memory.tracing.step import _unpacked_rows

    model, base = build(case, layers)
    low, upcast = getattr(torch, CASES[case][3]), CASES[case][4]
    fn = matmul_4bit()
    log = AllocationLog(lambda i, op, t: OPS.__setitem__(i, (op, tuple(t.shape), str(t.dtype))))
    events = log.events

    emulation = make_cuda_emulation(low, emulate_sdpa=True)
    with contextlib.ExitStack() as stack:
        stack.enter_context(_unpacked_rows())
        stack.enter_context(FakeTensorMode(allow_non_fake_inputs=True))
        stack.enter_context(make_scalar_fallback())
        model.to_empty(device="cpu")
        for p in model.parameters():
            if p.requires_grad or upcast:
                p.data = p.data.float()   # trainable weights fp32 (LLaMA-Factory adapter.py, peft); all under kbit prep
        for module in model.modules():
            if hasattr(module, "base_layer") and isinstance(module.base_layer, torch.nn.Linear):
                if dequant:
                    module.base_layer.forward = quantized_forward(fn, module.base_layer)
                module.forward = lora_forward(module, clone)
        base.lm_head.register_forward_hook(lambda m, a, out: out.float())              # 4.39.3 logits.float()
        trainable = [p for p in model.parameters() if p.requires_grad]
        before = sum(p.untyped_storage().nbytes() for p in model.parameters())
        opt = torch.optim.AdamW(trainable, lr=1e-4, foreach=True)
        for p in trainable:
            p.grad = torch.zeros_like(p)
        opt.step()                                   # states exist (steady state); grads of earlier micro-steps held
        before += sum(3 * p.numel() * 4 for p in trainable)
        ids = torch.randint(0, 32000, (1, seq))
        batch = {"input_ids": ids, "labels": ids.clone()}
        cls = type(base)
        if hasattr(cls, "loss_function"):            # releases from 4.46 call it; 4.39.3's forward is loss_439 itself
            saved = cls.loss_function
            cls.loss_function = property(lambda self: loss_439)
            stack.callback(setattr, cls, "loss_function", saved)
        existing = [*model.parameters(), *model.buffers(), *(p.grad for p in trainable),
                    *(v for state in opt.state.values() for v in state.values() if isinstance(v, torch.Tensor))]
        log.existing(existing)                       # allocated before the step: not replayed
        stack.enter_context(log.mode())
        with emulation:
            loss = model(**batch).loss
            emulation.end_region()
            emulation.backward(loss)
            del loss
        torch.nn.utils.clip_grad_norm_(trainable, 1.0, foreach=True)
        opt.step()
    return events, before


def replay(events: list[tuple[str, int, int]], steps: int = 3) -> Allocator:
    """The allocator after ``steps`` micro-steps of the same requests (keys renumbered per step)."""
    alloc = Allocator()
    live_at_end = {k for k, _ in _live(events)}
    for n in range(steps):
        offset = n * 10**9
        alloc.replay([(kind, key + offset, nbytes) for kind, key, nbytes in events])
        # what the step leaves alive (the loss, grads swapped in) is freed by the next step's start
        for k in live_at_end:
            if k + offset in alloc.live:
                alloc.free(k + offset)
    return alloc


def _live(events: list[tuple[str, int, int]]) -> list[tuple[int, int]]:
    freed = {k for kind, k, _ in events if kind == "f"}
    return [(k, b) for kind, k, b in events if kind == "a" and k not in freed]


#: where ``--write`` puts the replays bench/accuracy_replay.py reads
TABLE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench", "data", "allocator_replays.csv")
SOURCE_GROUP = "llamafactory_wiki_performance"
STACK = ("LLaMA-Factory 0.6.2/0.6.3 step as traced by scripts/trace_allocator_replay.py (transformers 5.24 Llama modules "
         "with 4.39.3's head and loss, peft 0.10.0's clone, bitsandbytes 0.43.1's dequantized weight and kept input, "
         "reentrant checkpointing, fp16 autocast, flash kernel), replayed by scripts/caching_allocator.py over 3 micro-steps")


def main() -> int:
    args = sys.argv[1:]
    write = "--write" in args
    case = args[args.index("--case") + 1] if "--case" in args else "llamafactory"
    lengths = [int(a) for a in args if a.isdigit()] or list(LENGTHS)
    print("seq  allocated_peak  reserved_peak  ratio  segments  (GiB, the step's own tensors)")
    rows = []
    for seq in lengths:
        events, before = events_of_step(seq, case=case)
        a = replay(events)
        rows.append((seq, a.peak_allocated, a.peak_reserved))
        print(f"{seq:6d}  {a.peak_allocated / GiB:7.3f}  {a.peak_reserved / GiB:7.3f}  "
              f"{a.peak_reserved / max(1, a.peak_allocated):.3f}  {a.segments}  (not replayed: {before / GiB:.3f} of 16-bit or fp32 "
              "stand-in weights, LoRA gradients and AdamW state)")
    if write and case == "llamafactory":
        import csv

        with open(TABLE, "w", newline="") as f:
            out = csv.writer(f)
            out.writerow(["source_group", "seq_len", "step_allocated_bytes", "step_reserved_bytes", "source"])
            out.writerows([SOURCE_GROUP, seq, al, rs, STACK] for seq, al, rs in rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
