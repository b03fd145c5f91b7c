"""Published training-throughput rows as perfguide cases: (ModelSpec, Setup, Hardware, published tokens/s per GPU).

Every row of bench/data/published_throughput.csv (a copy of the project's shared ground truth) either becomes a
``Case`` or is listed with the reason perfguide's Setup cannot express it (fp8 / tensor / pipeline / context
parallelism, vision models, unknown GPUs, unstated batch sizes). Nothing here knows what the model predicts:
the mapping reads only what the source states (and the inferences its ``notes`` column records).
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from accuracy_setup import LIGER_PARTIAL, PEFT_NOT_LORA, bnb_embedding_override
from throughput_bnb import bnb_release_of, quant_type_fields
from throughput_padding import effective_lengths
from throughput_specs import Skip, model_spec

from perfguide.hardware.types import Hardware
from perfguide.model.types import ModelSpec
from perfguide.setup import LoraSpec, Setup
from perfguide.speed.terms import LossImpl

ROOT = Path(__file__).resolve().parents[1]
CSV = ROOT / "bench" / "data" / "published_throughput.csv"


# Measurement protocol, not GPU physics: a rate published as samples / train_runtime over a short run (the
# DeepSpeed autotuning table: 200 steps, 50 for gpt2-xl) includes train()'s fixed start-up (dataloader workers,
# CUDA/cuBLAS initialisation, the first step's allocations). Fitted by bench/throughput_fit.py on those rows
# only; it never enters perfguide's model. Prior 0 (no start-up) when the rows that inform it are held out.
PROTOCOL = {"run_overhead_s": 0.0}

#: per row id: (ranks' mean padded length, the slowest rank's expected length), for rows logged per rank-step
_PADDING = effective_lengths()


#: why a row whose paged optimizer states overflow the GPU stays out of this fit; bench/techniques.py prices it
PAGED_OVERFLOW = ("paged optimizer states larger than the GPU's free memory: its step time hinges on the unified-memory "
                  "page traffic perfguide prices as a technique term (techniques/optimizers.py paged_seconds), which no "
                  "constant of this fit calibrates; compared in bench/results/techniques.md with this same reading")



@dataclass(frozen=True)
class Case:
    row_id: str
    group: str            # the unit left out in cross-validation (one published table file)
    table: str            # the unit rank correlation is computed in (one published table)
    framework: str        # framework class: hf_trainer, composer, torchtitan, plain_pytorch
    label: str
    spec: ModelSpec
    setup: Setup
    hardware: Hardware
    published: float      # tokens/s per GPU
    steps: int | None = None  # optimizer steps the published rate averages over, when it times a whole run
    attention_kernel: str | None = None  # a fused attention kernel older than FlashAttention-2 (efficiency.json)
    optimizer_impl: str | None = None    # a per-tensor optimizer loop of a pre-torch-2.0 stack (efficiency.json)
    loss: LossImpl | None = None         # a loss path other than transformers' (torchtune's, speed/terms.loss_bytes)
    bnb_release: str | None = None       # the bitsandbytes a 4-bit row ran (its dequantize kernel, speed/dequant.py)
    rank_share: float = 1.0   # ranks' mean padded length / the slowest rank's (bench/throughput_padding.py)


GROUPS = [  # (source, path prefix) -> group name
    ("mosaicml/llm-foundry", "", "llm-foundry"),
    ("microsoft/DeepSpeedExamples", "", "deepspeed-autotuning"),
    ("pytorch/torchtitan", "benchmarks/llama3_h100_202412", "torchtitan-202412"),
    ("pytorch/torchtitan", "benchmarks/asyncTP", "torchtitan-asynctp"),
    ("pytorch/torchtitan", "benchmarks/llama3-8b_h200", "torchtitan-h200"),
    ("pytorch/torchtitan", "torchtitan/components/quantization/mxfp8", "torchtitan-mxfp8"),
    ("pytorch/torchtitan", "torchtitan/components/quantization/nvfp4", "torchtitan-nvfp4"),
    ("pytorch/ao", "docs/source/workflows/training", "torchao-float8"),
    ("pytorch/ao", "torchao/optim", "torchao-optim"),
    ("pytorch/ao", "torchao/prototype/quantized_training", "torchao-qt"),
    ("hiyouga/LLaMA-Factory (GitHub wiki)", "", "llama-factory"),
    ("linkedin/Liger-Kernel", "examples/huggingface/results", "liger-hf-example-logs"),
    ("linkedin/Liger-Kernel", "", "liger"),
    ("huggingface/blog", "", "hf-blog-fsdp-deepspeed"),
    ("QwenLM/Qwen", "", "qwen-finetune"),
    ("huggingface/transformers", "docs/source/en/perf_train_gpu_one", "transformers-perf-train-gpu-one"),
    ("AnswerDotAI/fsdp_qlora", "", "answerai-fsdp-qlora"),
    ("pytorch/torchtune", "README.md", "torchtune-readme"),
    ("Dao-AILab/flash-attention", "training/README.md", "flash-attn-training"),
    ("foundation-model-stack/fms-fsdp", "README.md", "fms-fsdp"),
    ("jzhang38/TinyLlama", "README.md", "tinyllama"),
    ("foundation-model-stack/fms-acceleration", "scripts/benchmarks", "fms-acceleration"),
    ("huggingface/accelerate", "examples/fsdp2", "accelerate-fsdp2"),
    ("huggingface/peft", "method_comparison/MetaMathQA", "peft-method-comparison"),
    ("lambdal/deeplearning-benchmark", "pytorch/", "lambda-bert-squad"),
    ("huggingface/optimum-benchmark", "examples/training-llamas", "optimum-benchmark-llama-peft"),
    ("mli/transformers-benchmarks", "transformers.ipynb", "mli-transformers-benchmarks"),
]

# Publisher GPU names -> perfguide named GPUs. Torchtitan's H100s are 96GB HBM2e parts at 500 W (not stock
# 80GB SXM); the nearest named part is used and the report says so. "A100 (memory unstated)" -> 80GB SXM.
GPU_NAMES = [("v100-sxm2-16gb", "v100-16gb"), ("v100 16gb", "v100-16gb"), ("a100 80gb pcie", "a100-80gb-pcie"),
             ("h100 80gb pcie", "h100-pcie"), ("nvidia a10 24gb", "a10"), ("rtx 3090 ti", "rtx3090ti"), ("rtx 3090", "rtx3090"), ("h100 96gb", "h100-80gb"), ("h100", "h100-80gb"), ("h200", "h200"), ("a100-40gb", "a100-40gb"),
             ("a100-80gb", "a100-80gb"), ("a100", "a100-80gb"), ("v100", "v100-32gb"), ("rtx 4090", "rtx4090"),
             ("rtx 4070 ti super", "rtx4070tisuper"), ("rtx a6000", "a6000"),
             ("mi300x", "mi300x"), ("b200", "b200"), ("l40s", "l40s")]
# Multi-node rows that do not state their network: every 8-GPU H100 / H200 / B200 SXM platform ships one
# 400 Gb/s NIC per GPU (DGX H100 / H200 / B200 datasheets, AWS p5, Azure ND H100 v5: 3,200 Gb/s per node), so
# those rows get the named DGX node's network (perfguide/data/gpus.json "nodes") instead of the one-port default.
STATED_NETWORK = re.compile(r"(\d+) Gbps node-node")
DGX_NODE = {"h100-80gb": "dgx-h100", "h200": "dgx-h200", "b200": "dgx-b200"}
#: publisher parts a needle above would misname: gpus.json has the A100 40GB as the 400 W SXM4 part only (the PCIe
#: card is 250 W), so a row on the PCIe card is listed, not priced as the SXM part
UNNAMED_PARTS = ("a100 40gb pcie",)


# llm-foundry's tables do not print the attention kernel; its benchmark launcher sets it. At the commits that added
# the A100 tables (300cc5c58, 2023-05) and the H100 BF16 table with the A100 80GB refresh (b2a43a147, 2023-10),
# scripts/train/benchmarking/submit_benchmarks.py defaults to ``--attn_impl triton`` (the Triton FlashAttention
# kernel); the large-scale H100 table (5e85bd62d, 2024-01) comes from sweep.py, which passes ``--attn_impl flash``
# (flash-attn 2.4.2 via '.[gpu-flash2]': FlashAttention-2) for 1b/3b/7b/70b and ``triton`` for 13b/30b.
LARGE_SCALE_TRITON = ("mpt-13b", "mpt-30b")


def attention_kernel_of(row: dict[str, str], table: str) -> str | None:
    if "v1 CUDA kernel" in row["attn_impl"]:
        return "flash_v1"
    if row["source"] != "mosaicml/llm-foundry":
        return None
    if "Large Scale" in table:
        return "triton_flash" if row["model"].strip().lower() in LARGE_SCALE_TRITON else None
    return "triton_flash"


def group_of(row: dict[str, str]) -> str:
    for source, prefix, name in GROUPS:
        if row["source"] == source and row["source_path"].startswith(prefix):
            return name
    return row["source"]


def table_of(row: dict[str, str], group: str) -> str:
    m = named = re.search(r"table '([^']+)'", row["notes"])
    if group == "llm-foundry" and m:
        return f"llm-foundry: {m.group(1)}"
    m = re.search(r"Table (\d+)", row["notes"])
    if group.startswith("torchtitan") and m:
        return f"{group} table {m.group(1)}"
    if group == "deepspeed-autotuning":
        return group
    if group in ("answerai-fsdp-qlora", "torchtune-readme", "optimum-benchmark-llama-peft", "mli-transformers-benchmarks") and named:   # its case studies and the accelerator table are separate tables
        return f"{group}: {named.group(1)}"
    return group


def framework_of(row: dict[str, str]) -> str:
    """The stack, as a key of efficiency.json framework_efficiency."""
    fw = row["framework"].lower()
    if "unsloth" in fw:
        return "unsloth"
    if "composer" in fw:
        return "composer"
    if fw.startswith("flash-attn training") or "flash-attn fused kernels" in fw:
        # the flash-attn repo's fused LayerNorm/RMSNorm, rotary and cross-entropy kernels in a Lightning loop
        # (its own training stack; TinyLlama's lit-gpt fork runs the same kernels)
        return "flashattn_training"
    if "torchtitan" in fw:
        return "torchtitan"
    if "torchtune" in fw:
        return "torchtune"   # plain PyTorch recipes over torchtune's own modules (framework_eager_block_traffic)
    if "plain pytorch" in fw or "fms-fsdp" in fw:
        return "plain_pytorch"
    return "hf_trainer"  # HF Trainer, DeepSpeed + HF Trainer, Accelerate, LLaMA-Factory


def _int(text: str) -> int | None:
    m = re.match(r"\s*(\d+)", text or "")
    return int(m.group(1)) if m else None


def _hardware(row: dict[str, str], num_gpus: int, nodes: int) -> Hardware:
    gpu = row["gpu_type"].lower()
    if any(part in gpu for part in UNNAMED_PARTS):
        raise Skip(f"GPU {row['gpu_type']!r} is not a perfguide named GPU")
    for needle, name in GPU_NAMES:
        if needle in gpu:
            per_node = num_gpus // nodes
            if "power limited" in gpu:
                raise Skip(f"GPU {row['gpu_type']!r}: run under a power cap, so its sustained clocks are unknown")
            hw = Hardware.from_name(f"{name}:{per_node}" + (f"x{nodes}" if nodes > 1 else ""))
            m = STATED_NETWORK.search(row["notes"])
            if m and nodes > 1:   # llm-foundry's A100 tables state the cluster's network
                hw = hw.model_copy(update={"inter_node_bandwidth_gbps": int(m.group(1)) / 8})
            elif nodes > 1 and name in DGX_NODE and per_node == 8:
                node = Hardware.from_name(f"{DGX_NODE[name]}:8x{nodes}")
                hw = hw.model_copy(update={"inter_node_bandwidth_gbps": node.inter_node_bandwidth_gbps})
            return hw
    raise Skip(f"GPU {row['gpu_type']!r} is not a perfguide named GPU")


def _precision(row: dict[str, str]) -> dict[str, Any]:
    p = row["precision"].lower()
    if any(k in p for k in ("fp8", "float8", "nvfp4", "int8", "rowwise", "tensorwise")):
        raise Skip("fp8 / fp4 / int8 matmuls: not a Setup precision")
    if row["finetune"].lower().startswith("yes (qlora"):
        return {"weights_dtype": "nf4", **quant_type_fields(row)}
    if "apex amp o2" in p:
        # apex amp O2 casts the model to fp16 (cast_model_type) and patches no torch function: every op, softmax and
        # LayerNorm too, runs in fp16 on fp16 weights (the fp32 masters live in the optimizer), unlike torch autocast,
        # which runs softmax / layer_norm in fp32 over fp32 weights cast per op
        return {"weights_dtype": "fp16"}
    if ("amp" in p and "fp16" in p) or p.startswith("fp16"):
        return {"weights_dtype": "fp32", "autocast": "fp16"}
    if p.startswith("fp32"):
        return {"weights_dtype": "fp32"}
    if "full bf16" in p or ("pure" in p and "bf16 (fsdp" not in p) or p in ("bf16 weights",):
        return {"weights_dtype": "bf16"}
    # composer amp_bf16 / FSDP PURE, FSDP2 mixed precision, "bf16 AMP", accelerate bf16 mixed: fp32 master + bf16 compute
    return {"weights_dtype": "fp32", "autocast": "bf16"}


def _strategy(row: dict[str, str], num_gpus: int) -> dict[str, Any]:
    s = row["sharding"].lower()
    if any(k in s for k in ("tp ", "tp\u00a0", "+ tp", "pp ", "cp 2", "cp 4", "cp 8", "ep ")) or re.search(r"\btp\b|\bpp\b", s):
        raise Skip("tensor / pipeline / context / expert parallelism: not a training Setup strategy")
    if num_gpus == 1:
        return {"strategy": "single"}
    if "zero stage 0" in s or s.startswith("ddp"):
        return {"strategy": "ddp"}
    if "zero stage 1" in s or "zero-1" in s:
        return {"strategy": "zero1"}
    if "zero-3" in s or "zero stage 3" in s:
        return {"strategy": "zero3"}
    if "fsdp" in s:
        return {"strategy": "fsdp"}
    raise Skip(f"sharding {row['sharding']!r} not mapped")


def _optimizer(row: dict[str, str]) -> str:
    o = row["optimizer"].lower()
    if o.startswith("adafactor"):
        return "adafactor"
    if o.startswith("bnb pagedadamw8bit"):
        return "paged_adamw_8bit"  # bitsandbytes PagedAdamW8bit: Adam8bit's kernel, states in unified memory
    if o.startswith("bnb adam8bit"):
        return "adamw_bnb_8bit"   # bitsandbytes Adam8bit: both moments in 8-bit blocks, one fused kernel per tensor
    if "8-bit" in o or "4-bit" in o or "offload" in o or "wrapped in torchao" in o:
        raise Skip(f"optimizer {row['optimizer']!r} not priced by this bench")
    if "fused" in o or row["framework"].lower().startswith("deepspeed"):
        return "adamw_torch_fused"   # torch fused; DeepSpeed replaces the HF optimizer with its FusedAdam
    return "adamw_torch"             # HF AdamW / torch foreach / composer DecoupledAdamW


#: commits whose rows ran a bitsandbytes older than 0.39.0 (2023-06), the release whose paged optimizers added the
#: per-parameter torch.cuda.synchronize() to Optimizer8bit.step: the transformers single-GPU guide's 2022 Adam8bit rows
PRE_SYNC_BNB_COMMITS = frozenset({"0016acf7ef421c7fe8eff7945de52c71896c3b01"})


def optimizer_impl_of(row: dict[str, str]) -> str | None:
    """transformers' own AdamW ('adamw_hf', the Trainer default before 4.x's adamw_torch) steps one tensor at a time;
    so did torch.optim.AdamW before torch 2.0 made foreach the default: the rows measured with those stacks (the
    transformers single-GPU guide, 2022; HF Trainer without DeepSpeed in the DeepSpeed autotuning blog, 2022).
    bitsandbytes before 0.39 stepped each tensor with its kernel without draining the GPU after each one."""
    o = row["optimizer"].lower()
    if o.startswith("bnb") and row["commit"] in PRE_SYNC_BNB_COMMITS:
        return "per_tensor_kernel"
    if "adamw_hf" in o or "single-tensor loop" in o or ("hf trainer default" in o and "deepspeed" not in row["framework"].lower()):
        return "per_tensor_loop"
    return None


def loss_of(row: dict[str, str]) -> LossImpl | None:
    """torchtune's loss, as its notes name it: CEWithChunkedOutputLoss, or nn.CrossEntropyLoss over the model's
    upcast logits; every other stack computes transformers' loss (or prices like it)."""
    if framework_of(row) != "torchtune":
        return None
    return "chunked_upcast_in_loss" if "CEWithChunkedOutputLoss" in row["notes"] else "upcast_in_model"


def packed_doc_len_of(row: dict[str, str]) -> int | None:
    """The mean sample of a document-masked pack, where the notes give it with the code that masks (torchtune's
    packed_block_causal_mask); packs without a document mask attend causally over the whole sequence (None)."""
    m = re.search(r"packed_doc_len (\d+)", row["notes"])
    return int(m.group(1)) if m else None


def _expressible(row: dict[str, str]) -> None:
    """Rows whose step perfguide's Setup cannot state, whatever its constants."""
    if framework_of(row) == "unsloth":
        raise Skip("Unsloth: hand-written Triton kernels (fused LoRA MLP / attention projections, RoPE, RMSNorm, "
                   "cross-entropy) and its own offloaded checkpointing replace the HF + PEFT step perfguide prices")
    for pattern, reason in PEFT_NOT_LORA:   # a PEFT method or LoRA variant a LoraSpec cannot state (the memory bench's reading)
        found = pattern.search(row["finetune"])
        if found:
            raise Skip(reason.format(*found.groups()))
    partial = next((p for p in LIGER_PARTIAL if p in row["finetune"]), None)
    if partial:   # Liger's post_init_class patch, or its gemma2 patch of September 2024 (the memory bench's reading)
        raise Skip(f"{partial}: Setup.liger_kernel prices fused linear cross-entropy with every fused kernel")
    if "the log holds no training step" in row["notes"] or "prints no rate" in row["notes"]:   # mli's notebook: SVG-only cells
        raise Skip("no rate to compare: the run logged no training step (stopped before its first logged step), or the source prints no rate for it")
    if "gptq" in row["precision"].lower():
        raise Skip("GPTQ int4 base (AutoGPTQ kernels): perfguide prices bitsandbytes nf4 / int8 bases")
    if "physically inconsistent as stated" in row["notes"]:
        raise Skip("the published rate exceeds the GPU's dense peak on the FLOPs of the stated setup (the notes column "
                   "gives the arithmetic): the run cannot have been the setup the source states")
    if "column = max length" in row["notes"]:
        raise Skip("the column is a max length (cutoff_len) on an unstated dataset, not the tokens per sample, so the "
                   "real sample lengths (attention cost, per-sample overheads) are unknown; read as full-length "
                   "samples, the cutoff-16384 rate would need ~65% of the A100's 312 TFLOP/s on executed FLOPs "
                   "(6N + causal attention, with the recompute LLaMA-Factory enables) under HF Trainer + PEFT + bnb")


def syncs_each_micro_step(row: dict[str, str], strat: dict[str, object]) -> bool:
    """Composer reduce-scatters FSDP gradients on every microbatch: its ``ddp_sync_context`` enters ``no_sync`` only for
    a DistributedDataParallel model and yields unchanged otherwise (composer/distributed/dist_strategy.py), so its FSDP
    rows run as accelerate's ``sync_each_batch`` does. The other stacks' FSDP loops enter ``no_sync`` (HF Trainer through
    accelerate, Lightning Fabric's ``no_backward_sync``)."""
    return framework_of(row) == "composer" and strat.get("strategy") in ("fsdp", "fsdp_shard_grad_op")


def case_of(row: dict[str, str], *, paged_overflow: bool = False) -> Case:
    """The row's Case; ``paged_overflow=True`` prices a row whose paged optimizer states overflow the GPU (bench/techniques.py
    compares those, with this same reading) instead of leaving it out of the efficiency fit."""
    _expressible(row)
    group = group_of(row)
    seq = _int(row["seq_len"])
    mb = _int(row["micro_batch"])
    if not seq or not mb:
        raise Skip("sequence length or micro-batch not stated")
    ga = _int(row["grad_accum"]) or 1
    num_gpus = _int(row["num_gpus"]) or 1
    nodes = _int(row["nodes"]) or max(1, num_gpus // 8)
    if "states paged to host" in row["notes"] and not paged_overflow:
        raise Skip(PAGED_OVERFLOW)
    if "cpuoffload" in row["sharding"].lower():
        raise Skip("FSDP CPUOffload(offload_params=True): the speed model does not price parameter offload in training")
    spec = model_spec(row, seq)
    # per-rank padding to each batch's longest: the step is the slowest rank's, the rate counts every rank's tokens
    mean_len, step_len = _PADDING.get(row["row_id"], (float(seq), float(seq)))
    if "SequenceClassification" in row["finetune"]:  # a 2-label classifier on the pooled token, not the MLM head
        spec = spec.model_copy(update={"head": "sequence_classification", "num_labels": 2})
    if "BertForQuestionAnswering" in row["finetune"]:  # SQuAD: a 2-logit span head on every token, no MLM head
        spec = spec.model_copy(update={"head": "question_answering", "num_labels": 2})
    if "run_glue" in row["finetune"]:
        # GLUE fine-tuning puts a 3-way classifier on the encoder, not the tied masked-LM vocabulary head
        spec = spec.model_copy(update={"vocab_size": 3, "tie_word_embeddings": False})
    prec = _precision(row)
    strat = _strategy(row, num_gpus)
    ckpt = row["activation_checkpointing"].lower()
    lora = None
    if row["finetune"].lower().startswith("yes (qlora") or row["lora_rank"]:
        targets = re.search(r"lora targets: ([\w,]+)", row["notes"])
        alpha = re.search(r"lora alpha: (\d+)", row["notes"])
        lora = LoraSpec(r=_int(row["lora_rank"]) or 8, alpha=int(alpha.group(1)) if alpha else 16,
                        target_modules=tuple(targets.group(1).split(",")) if targets else "all-linear",
                        use_dora="use_dora True" in row["finetune"], use_rslora="use_rslora True" in row["finetune"])
    attn = row["attn_impl"].lower()
    attn_impl = "flash_attention_2" if "flash" in attn else ("eager" if attn.startswith("eager") else "sdpa")
    setup = Setup(micro_batch_size=mb, seq_len=round(step_len), gradient_accumulation_steps=ga, optimizer=_optimizer(row),
                  gradient_checkpointing=ckpt.startswith(("true", "full")) or (group == "llama-factory"),
                  attn_implementation=attn_impl, lora=lora, num_gpus=num_gpus // nodes, nodes=nodes,
                  torch_compile=row["torch_compile"].lower().startswith("yes"),
                  optimizer_in_backward="optimizer step in backward" in row["optimizer"].lower(),
                  activation_offloading=row["activation_offload"].lower().startswith("true"),
                  hybrid_shard=row["sharding"].lower().startswith("hsdp"), packed_doc_len=packed_doc_len_of(row),
                  liger_kernel="Liger kernels on" in row["finetune"],
                  kbit_upcast="skips prepare_model_for_kbit_training" not in row["notes"],   # get_peft_model alone
                  bnb_embedding_override=bnb_embedding_override(row["framework"], row["optimizer"]),
                  sync_grads_each_micro_step=syncs_each_micro_step(row, strat), **prec, **strat)
    hw = _hardware(row, num_gpus, nodes)
    if not ckpt and not setup.gradient_checkpointing:
        setup = _checkpointing_if_needed(spec, setup, hw)
    published = _published(row, seq, num_gpus)
    label = f"{row['model']} s{seq} mb{mb} {row['precision'][:14]} {setup.strategy} x{num_gpus}"
    m = re.search(r"steps per run: (\d+)", row["notes"])   # HF Trainer train_samples_per_second: whole train()
    table = table_of(row, group)
    return Case(row["row_id"], group, table, framework_of(row), label, spec, setup, hw, published,
                int(m.group(1)) if m else None, attention_kernel_of(row, table), optimizer_impl_of(row), loss_of(row),
                bnb_release_of(group), mean_len / round(step_len))


def _checkpointing_if_needed(spec: ModelSpec, setup: Setup, hw: Hardware) -> Setup:
    """A row that does not state activation checkpointing ran, so it fit: where perfguide's memory model puts the
    step over the GPU's memory without checkpointing and under it with checkpointing, the row is read as
    checkpointed (HF's blog FSDP/ZeRO-3 rows: a 7B model at 8 x 4096 tokens per GPU needs ~280 GiB of
    activations without it)."""
    from perfguide.memory.analytic import training_memory

    if training_memory(spec, setup, hw).fits:
        return setup
    ckpt = setup.model_copy(update={"gradient_checkpointing": True})
    return ckpt if training_memory(spec, ckpt, hw).fits else setup


def _published(row: dict[str, str], seq: int, num_gpus: int) -> float:
    if row["tokens_per_s_per_gpu"]:
        return float(row["tokens_per_s_per_gpu"])
    if row["tokens_per_s_total"]:
        return float(row["tokens_per_s_total"]) / num_gpus
    if row["samples_per_s"]:
        return float(row["samples_per_s"]) * seq / num_gpus
    raise Skip("no throughput column")


def load(path: Path = CSV) -> tuple[list[Case], list[tuple[dict[str, str], str]]]:
    cases, skipped = [], []
    with path.open(newline="", encoding="utf-8") as f:
        for row in csv.DictReader(f):
            try:
                cases.append(case_of(row))
            except Skip as why:
                skipped.append((row, str(why)))
    return cases, skipped
