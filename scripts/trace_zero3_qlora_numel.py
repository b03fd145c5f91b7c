"""What DeepSpeed ZeRO-3 partitions of a bitsandbytes 4-bit Linear stored in bf16 (QLoRA as PEFT's docs run it).

Run: ``PYTHONPATH=<deepspeed-0.14.4 source> .venv/bin/python scripts/trace_zero3_qlora_numel.py`` (the installed
DeepSpeed runs too and prints its version). One gloo rank on CPU (DS_ACCELERATOR=cpu): a ``bnb.nn.Linear4bit`` of
256 x 512 with ``quant_storage=torch.bfloat16`` and double quant is quantized, then ``deepspeed.zero.Init(module=...)``
converts it as ``deepspeed.initialize`` converts a model loaded without zero.Init (transformers loads quantized models
so). Prints JSON: the packed parameter's numel and dtype, DeepSpeed's ``ds_numel`` / ``ds_shape`` / partition, what
is left in ``param.data``, and the absmax elements of ``quant_state``.

Why: memory/zero3_window.py counts a QLoRA base's Linears in packed elements (``stored_per_element``: 4 parameters a
bf16 element) and memory/analytic.py keeps the absmax whole on every rank. Recorded on DeepSpeed 0.14.4 and 0.19.8
(bitsandbytes 0.50.2): numel 32,768 bf16 (131,072 weights / 4), ds_numel 32,768, ds_shape (32768, 1), data 0 after
partitioning, quant_state.absmax 2,048 uint8 elements (131,072 / 64) still on the parameter, whole.
"""

from __future__ import annotations

import json
import os
import socket
from typing import Any

os.environ["DS_ACCELERATOR"] = "cpu"


def main() -> None:
    import bitsandbytes as bnb
    import deepspeed
    import torch

    linear = bnb.nn.Linear4bit(256, 512, bias=False, compute_dtype=torch.bfloat16, quant_type="nf4",
                               quant_storage=torch.bfloat16, compress_statistics=True)
    weight: Any = linear.weight   # bnb's Params4bit
    linear.weight = weight._quantize("cpu")   # what .cuda() does on a GPU
    packed = linear.weight
    row = {"weights": 256 * 512, "numel": packed.numel(), "dtype": str(packed.dtype),
           "parameters": [name for name, _ in linear.named_parameters()], "buffers": [n for n, _ in linear.named_buffers()]}
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    deepspeed.init_distributed(dist_backend="gloo")
    config = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3}, "bf16": {"enabled": True}}
    deepspeed.zero.Init(module=torch.nn.Sequential(linear), config_dict_or_path=config)
    p: Any = linear.weight   # now a ZeRO-3 parameter
    row.update(deepspeed=deepspeed.__version__, bitsandbytes=bnb.__version__, ds_numel=p.ds_numel,
               ds_shape=list(p.ds_shape), partition=p.ds_tensor.numel(), data_after=p.data.numel(),
               absmax=p.quant_state.absmax.numel(), absmax_dtype=str(p.quant_state.absmax.dtype))
    print(json.dumps(row))


if __name__ == "__main__":
    main()
