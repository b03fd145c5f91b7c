"""What a row's framework adds to perfguide's memory model: its loss path (bytes beyond HF's fp32 cross-entropy),
the benchmark loop's held outputs, and the transformers / bitsandbytes releases the row ran.

bench/accuracy.py passes these to the memory model for each row that bench/accuracy_setup.py reads.
"""

from __future__ import annotations

import re

from accuracy_setup import ACCELERATE_AMP_OUTPUTS, LOOP_REBINDS_OUTPUTS, _pre_torch2

from perfguide.memory.bnb_inputs import kept_input_bytes
from perfguide.memory.eras import (
    amp_output_conversion_bytes,
    attention_buffer_bytes,
    attention_era_bytes,
    trainer_fsdp_pre_wrap_bytes,
    training_cache_bytes,
)
from perfguide.memory.loss_path import hf_loss_bytes, installed_transformers
from perfguide.model.types import ModelSpec
from perfguide.setup import Setup
from perfguide.techniques import per_rank

#: litgpt's chunked cross-entropy at its backward peak, bytes per b*s*V (traced: _loss_bytes)
LITGPT_LOSS_BYTES_PER_LOGIT = 6
#: litgpt's loop as its next forward returns, bytes per b*s*V: the new 16-bit logit chunks and the previous step's,
#: which the loop still holds (``logits = model(input_ids, ...)`` rebinds the name only once the call returns)
LITGPT_FORWARD_END_BYTES_PER_LOGIT = 4


def _loss_bytes(row: dict[str, str], spec: ModelSpec, setup: Setup) -> int | None:
    """Rows whose loss is not HF's fp32 cross-entropy: the framework's loss-path bytes (None = perfguide's).

    The transformers SDPA tables use ``loss=logits.sum()`` on 16-bit logits: the logits the script keeps plus
    their gradient, which SumBackward hands over as a stride-0 expand that the head's matmul backward makes
    contiguous (2 + 2 bytes per b*s*V). litgpt uses chunked cross-entropy on 16-bit logits (``model(input_ids,
    lm_head_chunk_size=128)``, ``chunked_cross_entropy``): traced on real CPU tensors (scripts/trace_litgpt.py, litgpt
    0.4.12, vocabulary 32768) its backward peaks at 6.0 bytes per b*s*V above the states: the 16-bit logit chunks the
    loop holds (2), every chunk's logit gradient, which waits for the head's matmul backward until the last chunk's
    cross-entropy backward has run (2), and the cross-entropy chunks not yet run backward, half of them at that point:
    their saved 16-bit log-softmax outputs and their nll gradients (1 + 1).
    """
    setup = per_rank(setup)   # a sequence-parallel rank prices its slice
    if setup.task != "train" or setup.liger_kernel or setup.cut_cross_entropy or setup.chunked_cross_entropy:  # its technique prices it
        return None
    if "loss=logits.sum()" in row["method"]:
        return (4 * setup.micro_batch_size * setup.seq_len * spec.vocab_size + _held_cache_bytes(spec, setup)
                + _attention_era_delta(row, spec, setup))
    if row["source_group"].startswith("litgpt"):
        return _litgpt_loss_bytes(row, spec, setup)
    if "CEWithChunkedOutputLoss" in row["method"]:
        # torchtune: every chunk's 16-bit logits (2) live until the recipe's `del logits`. Eager: each chunk's fp32
        # log-softmax output (4) is saved for backward and one chunk's fp32 upcast (4 / 8 chunks) is transient.
        # Compiled (torch.compile of compute_cross_entropy): the graph saves only the 16-bit chunk and per-row
        # statistics, and its backward is one fused kernel that writes the chunk's 16-bit gradient and nothing else
        # (torch 2.13 CPU Inductor's generated code, tests/test_compiled_block.py); autograd runs every chunk's
        # cross-entropy backward before any head matmul's (higher sequence numbers first), so a chunk's gradient
        # replaces its logits and one chunk holds both at once: 2 + 2 / 8. (Stop 41 priced 12 / 8 here, an fp32
        # upcast, softmax and gradient per chunk that the generated code never allocates.)
        per_logit = 2 + 2 / TORCHTUNE_CHUNKS if setup.torch_compile else 2 + 4 + 4 / TORCHTUNE_CHUNKS
        return int(per_logit * setup.micro_batch_size * setup.seq_len * spec.vocab_size)
    version = _transformers_version(row)
    if version is not None and spec.generates and not spec.is_encoder_decoder:
        alive = 2 if row["source_group"] in LOOP_REBINDS_OUTPUTS else 1
        cache = training_cache_bytes(spec, setup, version, alive, checkpointed=setup.gradient_checkpointing)
        held = hf_loss_bytes(spec, setup, version, row["source_group"] in LOOP_KEEPS_OUTPUTS) + cache
        converted = amp_output_conversion_bytes(spec, setup, version, alive, checkpointed=setup.gradient_checkpointing)
        return max(held, converted if row["source_group"] in ACCELERATE_AMP_OUTPUTS else 0)
    return None


def _litgpt_loss_bytes(row: dict[str, str], spec: ModelSpec, setup: Setup) -> int:
    """litgpt's loss-path peak, or the end of the next forward where that is higher.

    litgpt's loop (finetune/lora.py ``fit``, lit-gpt 2023 to litgpt 2024) keeps the previous micro-step's ``logits``
    list until ``logits = model(...)`` returns, and through its chunks' ``grad_fn`` the previous step's whole graph.
    A bitsandbytes release that keeps its matmul inputs as context attributes (bnb_inputs.kept_input_bytes: 4-bit
    up to 0.43.1; litgpt pinned 0.41.0 and then 0.42.0 through 2024) keeps them with that graph, so as the next
    forward returns its own activations meet the previous step's inputs and both steps' logits. Priced where
    consecutive micro-steps run the row's length: rows read at a ``max_seq_length`` cap that the data set's longer
    samples keep reaching (``_same_length_steps``). Where the row's length is its longest sample, lit-gpt 2023
    forces that sample into the first step (``get_batch(..., longest_seq_ix if iter_num == 0 else None)``) and the
    step after it is a random one, so the held inputs meet a shorter forward: not priced at the row's length.
    """
    logits = setup.micro_batch_size * setup.seq_len * spec.vocab_size
    backward_peak = LITGPT_LOSS_BYTES_PER_LOGIT * logits
    if not _same_length_steps(row):
        return backward_peak
    forward_end = LITGPT_FORWARD_END_BYTES_PER_LOGIT * logits + kept_input_bytes(spec, setup, _bnb_version(row))
    return max(backward_peak, forward_end)


def _same_length_steps(row: dict[str, str]) -> bool:
    """Consecutive micro-steps run at the row's length: it is a ``max_seq_length`` cut-off that padded batches keep
    reaching, not one longest sample."""
    return "max_seq_length" in row["seq_len"]


def _attention_era_delta(row: dict[str, str], spec: ModelSpec, setup: Setup) -> int:
    """What the row's transformers release saves in attention beyond the installed release (eras.attention_era_bytes,
    which the memory model already charges for the installed one). Saved activations are alive at the forward/loss
    peak, where these rows peak; passed with the loss bytes as the returned-cache term is. No stated or inferred
    release: nothing."""
    release = _transformers_version(row)
    if release is None or setup.gradient_checkpointing:   # checkpointed: in the recompute (accuracy_runtime.checkpoint_release)
        return 0
    ckpt = setup.gradient_checkpointing
    return (attention_era_bytes(spec, setup, release, checkpointed=ckpt)
            - attention_era_bytes(spec, setup, installed_transformers() or "0", checkpointed=ckpt))


def _resident_bytes(row: dict[str, str], spec: ModelSpec, setup: Setup) -> int:
    """Buffers the row's transformers release registers beyond the installed one (eras.attention_buffer_bytes:
    GPT-NeoX's per-block causal-mask buffer before 4.49) and, for HF Trainer rows under FSDP, the parameters its
    pre-wrap optimizer keeps (eras.trainer_fsdp_pre_wrap_bytes: 4.30-4.31), resident in every phase. No stated or
    inferred release, or not a training row: nothing."""
    setup = per_rank(setup)   # a sequence-parallel rank prices its slice
    release = _transformers_version(row)
    if release is None or setup.task != "train":
        return 0
    # HF Trainer rows: the pre-wrap optimizer's parameters some releases keep beside FSDP's shards (eras.py)
    trainer = trainer_fsdp_pre_wrap_bytes(spec, setup, release) if "HF Trainer" in row["method"] else 0
    return (attention_buffer_bytes(spec, setup, release)
            - attention_buffer_bytes(spec, setup, installed_transformers() or "0") + trainer)


def _block_code_bytes(row: dict[str, str], spec: ModelSpec, setup: Setup) -> int:
    """What torchtune's own block saves for backward beyond transformers' LlamaDecoderLayer (the table perfguide
    prices), on the blocks that are not checkpointed (a checkpointed run holds one recomputed block's worth: left out).

    torchtune's MultiHeadAttention (modules/attention.py, 0.4.0 and 1814feb17) expands k and v to every query head
    and reshapes them, a copy, before the attention kernel, which saves the copies: 2 x (heads - kv heads) x head_dim
    16-bit values per token more than transformers' SDPA path (``enable_gqa``). On packed rows the rotary takes
    ``input_pos``, so each of its two calls (q, k) gathers the fp32 cache at the tokens' positions ([b, s, head_dim
    / 2, 2] fp32), which the rotation's products save: 2 x 4 x head_dim bytes per token eager, one gather compiled
    (Inductor's graph computes it once). Traced (scripts/trace_compiled_block.py, data/techniques.json
    ``compiled_blocks``, Llama-3.2-3B's widths): torchtune 140,392 B per token eager, transformers 131,176:
    9,216 = 8,192 + 1,024; compiled 98,920 against 90,216: 8,704 = 8,192 + 512."""
    setup = per_rank(setup)   # a sequence-parallel rank prices its slice
    if "torchtune" not in row["source"] or setup.task != "train" or setup.gradient_checkpointing:
        return 0
    width = 2 if setup.weights_dtype in ("bf16", "fp16") else 4
    heads, kv, d = spec.num_attention_heads, spec.num_key_value_heads or spec.num_attention_heads, spec.head_dim
    expanded = 2 * (heads - kv) * d * width
    rope = (1 if setup.torch_compile else 2) * 4 * d if "packed" in row["seq_len"] else 0
    return (expanded + rope) * setup.micro_batch_size * setup.seq_len * spec.num_layers


def _held_cache_bytes(spec: ModelSpec, setup: Setup) -> int:
    """The benchmark loop's previous output, alive until the next forward returns (``outputs = model(...)``).

    Its logits are the 2 B per b*s*V the logits.sum() path already counts (old logits at the end of the next
    forward stand where the gradient stands in backward). transformers of 2024 also returned the KV cache from a
    training forward whenever ``config.use_cache`` was true (the default of these checkpoints), and that cache
    keeps storages alive through the next step's forward (HELD_CACHE_BYTES_PER_H, per layer per token).
    """
    held = HELD_CACHE_BYTES_PER_H.get(spec.model_type, 0)
    per_h = held.get(setup.attn_implementation, 0) if isinstance(held, dict) else held
    return per_h * spec.hidden_size * spec.num_layers * setup.micro_batch_size * setup.seq_len


#: Bytes per h per layer per token a 2024 training forward's returned cache keeps alive, read from the released
#: wheels of the tables' time and checked by a live-bytes trace of the benchmark loop (forward, logits.sum(),
#: backward, three steps) on real CPU fp16 tensors, use_cache=True minus False, 1- and 2-layer models, b 2/4 x s 128.
#: transformers 5.24 keeps none (same trace); a family not listed was not traced with its 2024 code, or held none.
HELD_CACHE_BYTES_PER_H: dict[str, int | dict[str, int]] = {
    # 4.42.4 GPTNeoXAttention: present = (key, value): the rotated key is a new tensor, fp32 under the script's
    # from_pretrained(torch_dtype=float16) load (fp32 rotary tables, eras.attention_era_bytes: 4 B per h), and value a
    # view of the fused query_key_value output, keeping its whole storage (2 B per 3h): 10 B per h for the previous
    # output. The current one adds what autograd does not save already: eager matmul saved a contiguous copy of value,
    # so the view keeps the 3h output (6); SDPA saved the value view and 16-bit q/k copies, so the fp32 key (4).
    # Trace (use_cache true minus false): eager 16.0, sdpa 14.0 (14.0 / 8.0 on a model cast with .half())
    "gpt_neox": {"eager": 16, "sdpa": 14},
    # 4.45.2 BioGptAttention: past_key_value = (key_states, value_states), two contiguous 16-bit copies (2 + 2). Trace:
    # +3.8 (sdpa and eager)
    "biogpt": 4,
    # 4.46.3 OPTAttention: past_key_value = (key_states, value_states), the contiguous key/value copies _shape made
    # (2 + 2). Trace +4.0 B per h per block (eager and sdpa; 4.46.3 and 5.24.0 alike) at 6 vs 12 blocks; a 1- vs 2-block
    # trace shows +0 because there the top block's backward temporaries, not the forward end, set the peak
    "opt": 4,
}


#: torchtune's CEWithChunkedOutputLoss default (torchtune/modules/loss/ce_chunked_output_loss.py: num_output_chunks=8)
TORCHTUNE_CHUNKS = 8
#: hand-written loops that hold the model output (its logits) while calling backward, as their scripts read
LOOP_KEEPS_OUTPUTS = {
    "hf_blog_pytorch_fsdp": "blog assets/62_pytorch_fsdp/run_clm_no_trainer.py: outputs = model(**batch); "
                            "loss = outputs.loss; ... accelerator.backward(loss)",
    "answerai_fsdp_qlora": "fsdp_qlora train.py: output = model(...); loss = output.loss; ... loss.backward(); "
                           "'output = None' only after the optimizer step",
    "open_instruct_issue_25": "open_instruct/finetune.py @0d2e152d7: outputs = model(**batch, use_cache=False); "
                              "loss = outputs.loss; ... accelerator.backward(loss)",
    "open_instruct_issue_12": "open_instruct/finetune.py @609312b24: the same loop",
    "deepspeed_chat_issue_411": "DeepSpeed-Chat step1_supervised_finetuning/main.py @76c16f1cc: outputs = model(**batch, "
                                "use_cache=False); loss = outputs.loss; model.backward(loss)",
    "peft_method_comparison_metamathqa": "peft method_comparison/MetaMathQA/run.py train(): outputs = model(**batch, "
                                         "num_items_in_batch=...); loss = outputs.loss; grad_scaler.scale(loss).backward()",
    "peft_issue_76_tracemalloc": "peft examples/causal_language_modeling/peft_lora_clm_accelerate_ds_zero3_offload.py "
                                 "@83ded43e: outputs = model(**batch); loss = outputs.loss; ... accelerator.backward(loss)",
    "peft_readme_memory_table": "pet examples/{conditional_generation/pet_lora_seq2seq,causal_language_modeling/"
                                "pet_lora_clm}_accelerate_ds_zero3_offload.py @61c577fc4: the same loop",
}
#: transformers release current when a pre-PyTorch-2.0 row ran (hf_blog_pytorch_fsdp, 2022-04-29: 4.18.0 of 2022-04-06)
PRE_TORCH2_TRANSFORMERS = "4.18.0"


def _transformers_version(row: dict[str, str]) -> str | None:
    """The transformers release of an HF-loss row, as its notes state or infer it ("transformers ~4.47",
    "transformers' default SDPA (4.38, inferred)"); a docs table measured for a modeling PR gets the first release
    that shipped the PR (DOC_TABLE_RELEASES); rows run before PyTorch 2.0 get the release of their time."""
    m = re.search(r"transformers\b[^0-9;]{0,30}(\d+\.\d+(?:\.\d+)?)", row["notes"] + " " + row["method"])
    if m:
        return m.group(1)
    for pr, release in DOC_TABLE_RELEASES.items():
        if pr in row["source"]:
            return release
    return PRE_TORCH2_TRANSFORMERS if _pre_torch2(row) else None


#: transformers model-doc SDPA tables measured on a modeling PR's code -> the first release shipping that code.
#: opt.md's table came with PR #33298 (add sdpa to OPT, 2024-09; https://github.com/huggingface/transformers/pull/33298):
#: OPTSdpaAttention is absent from the 4.45.2 wheel and present in 4.46.3 and 4.48.0, with the same OPTAttention
#: gpt_neox.md's table came with PR #31031 (add sdpa to GPT-NeoX, 2024; https://github.com/huggingface/transformers/pull/31031):
#: GPTNeoXSdpaAttention is absent from the 4.41.2 wheel and present in 4.42.4
DOC_TABLE_RELEASES = {"opt.md (PR #33298)": "4.46.0", "gpt_neox.md (PR #31031)": "4.42.0"}


BNB_RELEASES = (("2024-07-16", "0.43.2"),)  # bitsandbytes 0.43.2 (PyPI, 2024-07-16): MatMul4Bit stops saving inputs


def _bnb_version(row: dict[str, str]) -> str | None:
    """The bitsandbytes release of a quantized row: as the row states it, else the one current at its date."""
    if not row["quantization"].startswith("bnb"):
        return None
    m = re.search(r"bitsandbytes (\d+\.\d+\.\d+)", row["notes"] + " " + row["method"])
    if m:
        return m.group(1)
    date = re.search(r"\d{4}-\d{2}(-\d{2})?", row["commit_or_date"])
    if date and all(date.group() < day for day, _ in BNB_RELEASES):
        return "0.43.1"
    return None
