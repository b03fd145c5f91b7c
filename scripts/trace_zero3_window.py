"""Trace what DeepSpeed ZeRO-3 gathers on a rank through a LoRA step, frozen head vs trainable head, on CPU.

Run: ``PYTHONPATH=<deepspeed-0.14.4 source> HF_HUB_OFFLINE=1 .venv/bin/python scripts/trace_zero3_window.py``
(``pip download deepspeed==0.14.4 --no-deps --no-binary :all:`` and unpack; the installed DeepSpeed runs too and prints
its version). Two CPU ranks on gloo (DeepSpeed's CPU accelerator, DS_ACCELERATOR=cpu) train a tiny untied Llama (h 256,
FFN 512, 4 blocks, vocab 8000) under ``deepspeed.zero.Init`` + ZeRO-3 in bf16 with PEFT LoRA r=8 on q_proj/v_proj and
HF's reentrant checkpointing, as LLaMA-Factory's ds_z3_config.json runs (the three "auto" sizes as the Trainer fills
them for h=256; max_live / max_reuse scaled from 1e9 to 1.5e6 so the window spans ~2 blocks, as 1e9 spans ~4 of
Qwen2-7B's). Step 3 is recorded on rank 0: DeepSpeed's own count of gathered elements after every fetch (the
coordinator's ``__n_available_params`` is zeroed by ``reset_step`` while
parameters stay gathered, so the script sums ``ds_numel`` over every parameter not NOT_AVAILABLE) and the profiler's live CPU bytes (every allocation and free) from the step's
start, through forward + loss and through backward. Run "head" also trains lm_head.weight.

Prints JSON: per run, the coordinator's peak gathered elements in forward and backward, the live-byte peaks, and
perfguide's ``zero3_live_elements`` for the same model and knobs. Why: memory/zero_runtime.py prices ZeRO-3's gathered
window from a reading of the coordinator's code, and this checks the reading on the code itself.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path
from typing import Any

os.environ["DS_ACCELERATOR"] = "cpu"
os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

H, FFN, LAYERS, VOCAB, B, S, WORLD = 256, 512, 4, 8000, 1, 64, 2
CONFIG: dict[str, Any] = dict(hidden_size=H, intermediate_size=FFN, num_hidden_layers=LAYERS, num_attention_heads=4,
                              num_key_value_heads=4, vocab_size=VOCAB, tie_word_embeddings=False, use_cache=False)
KNOBS = dict(reduce_bucket_size=H * H, stage3_prefetch_bucket_size=int(0.9 * H * H),
             stage3_param_persistence_threshold=10 * H, stage3_max_live_parameters=1_500_000,
             stage3_max_reuse_distance=1_500_000)


def _run(rank: int, port: int, train_head: bool, out: str) -> None:
    import deepspeed
    import torch
    from deepspeed.accelerator.cpu_accelerator import CPU_Accelerator
    from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus
    from deepspeed.runtime.zero.partitioned_param_coordinator import PartitionedParameterCoordinator as Coord
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(WORLD),
                      LOCAL_RANK=str(rank))
    # one node of WORLD ranks: the CPU accelerator counts NUMA nodes with numactl, absent here
    CPU_Accelerator.device_count = lambda self: WORLD
    deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(0)
    ds = {"train_micro_batch_size_per_gpu": B, "bf16": {"enabled": True}, "zero_allow_untested_optimizer": True,
          "zero_force_ds_cpu_optimizer": False,
          "zero_optimization": {"stage": 3, "contiguous_gradients": True, "overlap_comm": False, **KNOBS}}
    with deepspeed.zero.Init(config_dict_or_path=ds):
        model = LlamaForCausalLM(LlamaConfig(**CONFIG))
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
    model.enable_input_require_grads()
    model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], lora_dropout=0.0))
    if train_head:
        model.base_model.model.lm_head.weight.requires_grad_(True)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4)
    eng, *_ = deepspeed.initialize(model=model, optimizer=opt, config=ds)

    gathered: dict[str, list[int]] = {"forward": [], "backward": []}
    phase = {"now": ""}
    fetch = Coord.fetch_sub_module

    def counted(self: Any, module: Any, forward: bool) -> None:
        fetch(self, module, forward)
        if phase["now"]:   # gathered or in flight, whatever the coordinator's own counter says (reset_step zeroes it)
            gathered[phase["now"]].append(sum(p.ds_numel for p in all_params if p.ds_status != ZeroParamStatus.NOT_AVAILABLE))

    all_params = list(eng.module.parameters())
    Coord.fetch_sub_module = counted
    x = torch.randint(0, VOCAB, (B, S), generator=torch.Generator().manual_seed(1))
    events: list[tuple[int, int, str]] = []
    for step in range(3):
        last = step == 2
        if last:
            prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True)
            prof.__enter__()
        phase["now"] = "forward" if last else ""
        with torch.profiler.record_function("mark_start"):
            pass
        loss = eng(input_ids=x, labels=x).loss
        with torch.profiler.record_function("mark_forward"):
            pass
        phase["now"] = "backward" if last else ""
        eng.backward(loss)
        with torch.profiler.record_function("mark_backward"):
            pass
        phase["now"] = ""
        eng.step()
        if last:
            prof.__exit__(None, None, None)
            for ev in prof.events():
                if ev.name.startswith("mark_"):
                    events.append((ev.time_range.start, 0, ev.name[5:]))
                elif ev.cpu_memory_usage:
                    events.append((ev.time_range.start, ev.cpu_memory_usage, ""))
    if rank == 0:
        from trace_fsdp1_phases import live_peaks  # the same start / forward / backward marks

        peaks = live_peaks(events)
        Path(out).write_text(json.dumps({"deepspeed": deepspeed.__version__,
                                         "gathered_peak": {k: max(v) for k, v in gathered.items()},
                                         "live_peak_bytes": peaks}))


def _simulated() -> dict[str, int]:
    from perfguide.memory.ledger import ledger
    from perfguide.memory.zero3_window import Zero3Knobs, persistent_elements, zero3_live_elements, zero3_trace
    from perfguide.model.types import ModelSpec
    from perfguide.setup import LoraSpec, Setup

    spec = ModelSpec.from_any({"model_type": "llama", "architectures": ["LlamaForCausalLM"], **CONFIG})
    knobs = Zero3Knobs(KNOBS["reduce_bucket_size"], KNOBS["stage3_prefetch_bucket_size"],
                       KNOBS["stage3_param_persistence_threshold"], KNOBS["stage3_max_live_parameters"],
                       KNOBS["stage3_max_reuse_distance"])
    lora = Setup(task="train", strategy="zero3", num_gpus=WORLD, weights_dtype="bf16",
                 lora=LoraSpec(r=8, alpha=16, target_modules=("q_proj", "v_proj")))
    persistent = persistent_elements(spec, ledger(spec, lora).trainable, knobs)
    fwd, bwd = zero3_live_elements(*zero3_trace(spec, checkpointed=True, embedding_trainable=False), knobs, persistent)
    return {"forward": fwd, "backward": bwd}


def main() -> None:
    import tempfile

    import torch.multiprocessing as mp

    result: dict[str, Any] = {"perfguide_gathered_peak": _simulated()}
    for name, train_head in (("frozen_head", False), ("trainable_head", True)):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        with tempfile.TemporaryDirectory() as tmp:
            out = str(Path(tmp) / "r.json")
            mp.spawn(_run, args=(port, train_head, out), nprocs=WORLD)
            result[name] = json.loads(Path(out).read_text())
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
