"""One rank of a real FSDP2 run on CPU/gloo, started by tests/test_launch.py with the generated accelerate YAML.

accelerate 1.15's Accelerator never enters FSDP mode on CPU (state.py promotes only GPU-like distributed types),
so this script does what ``Accelerator.prepare`` does for FSDP2 on a GPU: it builds the FSDP plugin from the
environment that ``accelerate launch`` exported from the YAML, and shards the model with accelerate's own
``fsdp2_prepare_model``. Everything the plan decided (version, resharding, wrap class) comes from the YAML; an
HSDP plan's ``parallelism_config`` arrives as accelerate's PARALLELISM_CONFIG_* variables and becomes the 2-D
mesh accelerate builds (ParallelismConfig.build_device_mesh), as Accelerator does on GPUs.

argv: <recommendation.json> <out_dir>. Writes rank<N>.json with what actually ran.
"""

import os
import sys
from pathlib import Path
from types import SimpleNamespace

import torch
from accelerate import Accelerator, ParallelismConfig
from accelerate.utils import FullyShardedDataParallelPlugin
from accelerate.utils.fsdp_utils import fsdp2_prepare_model
from launch_common import finish  # tests/ is the script's directory, so it is importable
from torch.distributed.tensor import DTensor
from transformers import AutoModelForCausalLM, LlamaConfig

from perfguide import Recommendation


def main() -> None:
    rec = Recommendation.model_validate_json(Path(sys.argv[1]).read_text())
    out = Path(sys.argv[2])
    # accelerate validates a parallelism config only against GPU-like distributed types: take it before Accelerator
    hsdp = os.environ.pop("ACCELERATE_USE_PARALLELISM_CONFIG", "") == "true"
    acc = Accelerator(cpu=True)  # initialises the gloo process group from the launcher's environment
    plugin = FullyShardedDataParallelPlugin()  # every field read from the FSDP_* variables the YAML produced
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    model = AutoModelForCausalLM.from_config(config)
    full_numel = sum(p.numel() for p in model.parameters())
    plugin.set_auto_wrap_policy(model)
    pc = ParallelismConfig() if hsdp else None  # sizes from the PARALLELISM_CONFIG_* variables
    mesh = pc.build_device_mesh("cpu") if pc is not None else None
    shim = SimpleNamespace(state=SimpleNamespace(fsdp_plugin=plugin), device=acc.device, is_main_process=acc.is_main_process,
                           mixed_precision="no", torch_device_mesh=mesh, parallelism_config=pc)
    model = fsdp2_prepare_model(shim, model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(acc.process_index)
    losses = []
    for _ in range(2):
        ids = torch.randint(0, 128, (rec.setup.micro_batch_size, 16), generator=g)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    params = list(model.parameters())
    report = {
        "rank": acc.process_index, "world_size": acc.num_processes, "steps": len(losses), "losses": losses,
        "fsdp_version": plugin.fsdp_version, "reshard_after_forward": plugin.reshard_after_forward,
        "wrap": sorted(plugin.transformer_cls_names_to_wrap or []),
        "all_dtensor": all(isinstance(p, DTensor) for p in params),
        "local_numel": sum(p.to_local().numel() for p in params), "full_numel": full_numel,
        "wrapper": type(model).__name__,
        "mesh": {name: mesh[name].size() for name in mesh.mesh_dim_names} if mesh is not None else None,
    }
    finish(out, acc.process_index, report)


if __name__ == "__main__":
    main()
