"""DoRA under DeepSpeed ZeRO-3 on CPU: does peft's DoRA forward see the gathered base weight, and what does it keep?

Run: ``HF_HUB_OFFLINE=1 .venv/bin/python scripts/trace_dora_zero3.py`` (two CPU ranks on gloo, DS_ACCELERATOR=cpu,
about a minute). A tiny Llama built under ``deepspeed.zero.Init`` (HfDeepSpeedConfig set first, as
TrainingArguments(deepspeed=...) does, so peft's gather_params_ctx gathers the weight for DoRA's init), bf16, PEFT
DoRA r=8 on q_proj / v_proj, lora_dropout 0 and 0.1, ZeRO-3 with the release knobs at their smallest
(max_live_parameters / max_reuse_distance / prefetch 1), three steps. A wrapper around ``DoraLinearLayer.forward``
records the base weight's shape and ZeRO status as DoRA reads it, and (saved_tensors_hooks) the weight-shaped tensors
its forward keeps for backward other than the weight itself.

Seen (DeepSpeed 0.19.8, peft 0.21.2): the weight is AVAILABLE at its full shape (256 x 256, not the 1/2 partition) in
every DoRA forward, and the steps train (loss falls); dropout 0 keeps one fp32 256 x 256 tensor (the in x in identity
lora_A keeps for its gradient: in = out here), dropout 0.1 one more, the full-size fp32 copy ``W.to(x.dtype)`` the
re-run matmul keeps. So ZeRO-3 prices DoRA's weight copy and norm transient on the whole weight, per rank, as
memory/lora_activations.py does.
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
from pathlib import Path
from typing import Any

os.environ["DS_ACCELERATOR"] = "cpu"
os.environ.setdefault("HF_HUB_OFFLINE", "1")
WORLD = 2
CONFIG: dict[str, Any] = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
                              num_key_value_heads=4, vocab_size=1000, tie_word_embeddings=False, use_cache=False)


def _run(rank: int, port: int, dropout: float, out: str) -> None:
    import deepspeed
    import torch
    from deepspeed.accelerator.cpu_accelerator import CPU_Accelerator
    from peft import LoraConfig, get_peft_model
    from peft.tuners.lora import dora
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.integrations import HfDeepSpeedConfig

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(WORLD),
                      LOCAL_RANK=str(rank))
    CPU_Accelerator.device_count = lambda self: WORLD   # one node of WORLD ranks (no numactl here)
    deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(0)
    ds = {"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True}, "zero_allow_untested_optimizer": True,
          "zero_force_ds_cpu_optimizer": False,
          "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 10, "stage3_max_live_parameters": 1,
                                "stage3_max_reuse_distance": 1, "stage3_prefetch_bucket_size": 1}}
    keep = HfDeepSpeedConfig(ds)   # what TrainingArguments(deepspeed=...) sets: peft's gather_params_ctx sees ZeRO-3
    with deepspeed.zero.Init(config_dict_or_path=ds):
        model = LlamaForCausalLM(LlamaConfig(**CONFIG))
    model = get_peft_model(model, LoraConfig(r=8, target_modules=["q_proj", "v_proj"], lora_dropout=dropout, use_dora=True))
    seen: list[Any] = []
    original = dora.DoraLinearLayer.forward

    def recorded(self: Any, x: Any, **kw: Any) -> Any:
        w = kw["base_layer"].weight
        kept: list[tuple[str, int]] = []

        def pack(t: Any) -> Any:
            if t.dim() == 2 and tuple(t.shape) == tuple(w.shape) and t.untyped_storage().data_ptr() != w.untyped_storage().data_ptr():
                kept.append((str(t.dtype), t.numel()))
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            result = original(self, x, **kw)
        seen.append((tuple(w.shape), w.numel(), str(getattr(w, "ds_status", None)), tuple(kept)))
        return result

    dora.DoraLinearLayer.forward = recorded   # type: ignore[method-assign]
    params = [p for p in model.parameters() if p.requires_grad]
    eng, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.AdamW(params, lr=1e-4), config=ds)
    x = torch.randint(0, 1000, (1, 32), generator=torch.Generator().manual_seed(1))
    res: dict[str, Any] = {}
    try:
        for step in range(3):
            loss = eng(input_ids=x, labels=x).loss
            eng.backward(loss)
            eng.step()
            res[f"loss{step}"] = float(loss.detach())
    except RuntimeError as e:   # report what ZeRO-3 broke, if anything (a shape mismatch on a partitioned weight)
        res["error"] = f"{type(e).__name__}: {e}"[:400]
    res["seen"] = sorted(set(seen))
    res["deepspeed"] = deepspeed.__version__
    del keep
    if rank == 0:
        Path(out).write_text(json.dumps(res))


def main() -> None:
    import torch.multiprocessing as mp

    for dropout in (0.0, 0.1):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        with tempfile.TemporaryDirectory() as tmp:
            out = str(Path(tmp) / "r.json")
            mp.spawn(_run, args=(port, dropout, out), nprocs=WORLD)
            print("lora_dropout", dropout, Path(out).read_text())


if __name__ == "__main__":
    main()
