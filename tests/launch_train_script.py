"""Training script started by tests/test_launch.py through `accelerate launch`: one rank of a tiny run.

argv: <recommendation.json> <out_dir>. Builds the plan's TrainingArguments inside the launched process,
prepares a tiny Llama with the plan, trains 2 steps with a real Trainer, writes rank<N>.json with what
actually ran (world size, wrapper class, steps) so the test can check it.
"""

import os
import sys
from pathlib import Path

import torch
from launch_common import finish  # tests/ is the script's directory, so it is importable
from transformers import AutoModelForCausalLM, LlamaConfig, Trainer

from perfguide import Recommendation


def main() -> None:
    rec = Recommendation.model_validate_json(Path(sys.argv[1]).read_text())
    out = Path(sys.argv[2])
    args = rec.training_args(output_dir=str(out / "trainer"), max_steps=2, report_to="none", save_strategy="no",
                             logging_strategy="no", disable_tqdm=True)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    model = rec.prepare_model(AutoModelForCausalLM.from_config(config))
    ids = torch.randint(0, 128, (16, 16), generator=torch.Generator().manual_seed(0))
    trainer = Trainer(model=model, args=args, train_dataset=[{"input_ids": r, "labels": r} for r in ids])
    trainer.train()
    report = {
        "rank": args.process_index, "world_size": args.world_size, "steps": trainer.state.global_step,
        "wrapper": type(trainer.model_wrapped).__name__, "distributed_type": str(trainer.accelerator.distributed_type),
        "omp_threads": os.environ.get("OMP_NUM_THREADS"), "torch_threads": torch.get_num_threads(),
    }
    finish(out, args.process_index, report)


if __name__ == "__main__":
    main()
