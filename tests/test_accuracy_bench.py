"""bench/accuracy.py and the per-source summary both benches share (issue 24): the headline is the median of the
per-source medians, computed here by hand; the rows added from new sources read back as the setups their
sources state; a constant read off bench rows is held out of its own source's rows with the value its source
text gives for the other rows; a max-context row is judged at the boundary the model draws."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

import pytest
from helpers import load_bench

ROOT = Path(__file__).resolve().parents[1]


def test_median_of_source_medians_by_hand() -> None:
    summary = load_bench("_report").SourceSummary.of({"big": [1.0, 2.0, 3.0, 40.0, 50.0], "b": [9.0], "c": [4.0, 6.0]})
    # per source: big 3 (not its 50s), b 9, c 5; the median of {3, 9, 5} is 5, while the row median of all 8 is 5.0/6
    assert summary.medians == {"b": 9.0, "big": 3.0, "c": 5.0}
    assert summary.median_of_medians == 5.0
    assert summary.worst == ("b", 9.0)
    assert "NOT met" in summary.line(4.0, 20.0) and "met" in summary.line(5.0, 9.0)


def test_held_out_values_are_the_ones_the_constant_names_for_the_other_rows(acc: ModuleType) -> None:
    """Each held-out value is in its constant's source. reserved_over_allocated is a placeholder no row informs (optimum's
    GPTQ rows, once read as NVML totals, print the allocator's peak plus the memory outside it): hf_blog row 647
    (1.022) takes the placeholder, and optimum's rows read no reserved figure, so they hold nothing out."""
    table = json.loads((ROOT / "perfguide" / "data" / "calibration.json").read_text(encoding="utf-8"))
    for group, values in acc.HELD_OUT.items():
        for key, value in values.items():
            assert f"{value:.3f}" in table[key]["source"], (group, key)
    assert "optimum_gptq_benchmark" not in acc.HELD_OUT
    assert acc.HELD_OUT["hf_blog_pytorch_fsdp"]["reserved_over_allocated"] == table["reserved_over_allocated"]["value"]
    assert table["reserved_over_allocated"]["source"].startswith("[I] Placeholder")
    with acc.held_out("hf_blog_pytorch_fsdp"):
        from perfguide._data import fact_value

        assert fact_value("calibration", "reserved_over_allocated_training") == table["reserved_over_allocated_training"]["value"]
        assert fact_value("calibration", "reserved_at_oom_over_allocated") == 1.010


def test_v100_trainer_rows_read_as_the_docs_training_arguments(acc: ModuleType, rows) -> None:
    """perf_train_gpu_one: bert-large-uncased sequence classification, 512 tokens, V100 16GB; e.g. the row with
    per_device_train_batch_size=1, gradient_accumulation_steps=4, gradient_checkpointing=True, fp16=True,
    optim='adafactor' (4847 MB)."""
    row = next(r for r in rows.values() if r["source_group"] == "transformers_perf_train_gpu_one" and r["peak_mem_value"] == "4847")
    spec = acc._spec(row["model_hf_id"])
    setup = acc._train_setup(row, spec)
    assert (setup.micro_batch_size, setup.gradient_accumulation_steps, setup.seq_len) == (1, 4, 512)
    assert setup.gradient_checkpointing and setup.autocast == "fp16" and setup.weights_dtype == "fp32"
    assert setup.optimizer == "adafactor" and setup.attn_implementation == "eager"
    hw = acc._hardware(row["gpu_type"], 1)
    assert hw.smallest_gpu.memory_total == 16160 * 2**20  # the doc's nvidia-smi: 2631MiB / 16160MiB
    result = acc.evaluate(row, [])
    assert result.kind == "value" and result.published == 4847


def test_fsdp_qlora_rows_keep_their_sharding_and_adapters(acc: ModuleType, rows) -> None:
    aa = [r for r in rows.values() if r["source_group"] == "answerai_fsdp_qlora"]
    ddp = next(r for r in aa if r["parallelism"].startswith("DDP") and r["quantization"])
    spec = acc._spec(ddp["model_hf_id"])
    setup = acc._train_setup(ddp, spec)
    assert setup.strategy == "ddp" and setup.weights_dtype == "nf4" and not setup.kbit_upcast
    assert setup.lora is not None and setup.lora.r == 64
    # train.py's 'all': q, k, v, gate, up, down on every block; no o_proj
    assert not any(name.endswith("o_proj") for name in setup.lora.target_modules)
    assert {n.split(".")[-1] for n in setup.lora.target_modules} >= {"q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "down_proj"}
    offload = next(r for r in aa if "CPUOffload" in r["parallelism"])
    assert acc._train_setup(offload, acc._spec(offload["model_hf_id"])).offload_params
    # train.py wraps every trainable leaf (the LoRA Linears) as its own FSDP unit with use_orig_params=False: the frozen
    # base sits in FlatParameters that need no gradient, so a bf16 LoRA row carries only the adapters' gradients
    from perfguide.memory.analytic import frozen_params_get_grads, training_memory

    lora = next(r for r in aa if r["method"].startswith("LoRA") and r["parallelism"].startswith("FSDP"))
    setup = acc._train_setup(lora, spec)
    assert not frozen_params_get_grads(setup)
    est = training_memory(spec, setup)
    assert est.gradients < 0.05 * spec.total_params * 2 / setup.num_gpus   # adapters only, far below the base's grads


def test_max_context_is_the_models_own_boundary(acc: ModuleType, rows) -> None:
    row = next(r for r in rows.values() if r["source_group"] == "unsloth_long_context" and r["gpu_type"].startswith("24 GB"))
    spec = acc._spec(row["model_hf_id"])
    setup = acc._train_setup(row, spec)
    hw = acc._hardware(row["gpu_type"], 1)
    assert hw.smallest_gpu.memory_total == 24 * 2**30
    longest = acc.max_context(row, spec, setup, hw)
    assert acc._fits(row, spec, setup.replace(seq_len=longest), hw)
    assert not acc._fits(row, spec, setup.replace(seq_len=longest + 16), hw)
    result = acc.evaluate(row, [])
    assert result.kind == "context" and result.published == 5789 and result.predicted == longest


def test_torchtune_chunked_loss_bytes_hand_derived(acc: ModuleType, rows) -> None:
    """torchtune CEWithChunkedOutputLoss, 8 chunks: compiled keeps the 16-bit logits (2 B) plus one chunk's 16-bit
    gradient (2 / 8; tests/test_compiled_block.py reads the generated backward); eager also saves every chunk's fp32
    log-softmax output (2 + 4 + 4 / 8)."""
    row = rows["690"]
    spec = acc._spec(row["model_hf_id"])
    setup = acc._train_setup(row, spec)
    tokens_v = setup.micro_batch_size * setup.seq_len * spec.vocab_size
    assert setup.torch_compile and acc._loss_bytes(row, spec, setup) == int(2.25 * tokens_v)
    assert acc._loss_bytes(row, spec, setup.replace(torch_compile=False)) == int(6.5 * tokens_v)


def test_eager_cross_entropy_saves_its_fp32_log_softmax() -> None:
    """Real tensors: what autograd saves for a chunk's F.cross_entropy(logits.float()) besides the logits themselves
    is the 4-byte log-softmax output per logit (the eager term above)."""
    import torch
    import torch.nn.functional as F

    logits = torch.randn(2, 64, 512, dtype=torch.bfloat16, requires_grad=True)
    labels = torch.randint(0, 512, (2 * 64,))
    saved: dict[int, int] = {}   # by storage: nll_loss saves the same log-probabilities log_softmax saved

    def pack(t: torch.Tensor) -> torch.Tensor:
        if t.untyped_storage().data_ptr() != logits.untyped_storage().data_ptr():
            saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        F.cross_entropy(logits.float().reshape(-1, 512), labels, reduction="sum")
    assert sum(saved.values()) / logits.numel() == pytest.approx(4.0, abs=0.05)


def test_litgpt_bnb_layout_by_hand() -> None:
    """litgpt (Lightning's BitsandbytesPrecision) on falcon-7b: its GPT keeps an lm_head of its own (65024 x 4544)
    and quantizes it with the blocks. Hand count: 32 blocks x (4544x4672 + 4544x4544 + 2 x 4544x18176) Linear
    elements + embedding + lm_head; int8 load of the lm_head holds an fp16 copy (2 B), CB and CBt (1 + 1 B) and
    one fp32 scale per row; an nf4 prefill dequantizes it to fp16 and casts to bf16 (2 + 2 B)."""
    lit = load_bench("accuracy_litgpt")
    from perfguide.model.types import ModelSpec

    spec = ModelSpec.from_any("tiiuae/falcon-7b")
    head = 65024 * 4544
    block = 4544 * 4672 + 4544 * 4544 + 2 * 4544 * 18176
    norms_biases = spec.total_params - spec.embedding_params - 32 * block  # layer norms: small, 16-bit
    assert lit.litgpt_weight_bytes(spec, "", 2) == 2 * (32 * block + 2 * head + norms_biases)
    assert abs(lit.litgpt_weight_bytes(spec, "", 2) / 1e9 - 14.43) < 0.01  # the quantize doc's 14.50 GB less the cache
    int8 = lit.litgpt_weight_bytes(spec, "bnb.int8", 2)
    assert int8 == 32 * (block + 4 * (4672 + 4544 + 18176 + 4544)) + head + 4 * 65024 + 2 * (head + norms_biases)
    load, prefill = lit.litgpt_transient_bytes(spec, "bnb.int8", 2, True)
    assert (load, prefill) == (2 * head + head + 4 * 65024 + head, head)
    load, prefill = lit.litgpt_transient_bytes(spec, "bnb.nf4-dq", 2, False)
    assert prefill == 4 * head and load == 2 * head + head // 2 + head // 64 + 4 * head // (64 * 256)
    assert lit.litgpt_transient_bytes(spec, "bnb.nf4", 2, True)[1] == 2 * head  # fp16 compute: no second cast
    # generate/sequentially.py on 4 devices: the root holds 8 blocks with the embedding and lm_head
    assert lit.litgpt_weight_bytes(spec, "", 2, blocks=8) == 2 * (8 * block + 2 * head + norms_biases)


def test_qwen_readme_rows_read_as_finetune_lora_single_gpu(acc: ModuleType, rows) -> None:
    """Qwen README profiling: Qwen-7B (7.72 B parameters, its model card) LoRA r=64 on c_attn, c_proj, w1, w2 (every
    block Linear), batch 1 padded to the length, gradient checkpointing, flash attention 2, on one A100 80GB."""
    row = next(r for r in rows.values() if r["source_group"] == "qwen_readme_profiling" and r["peak_mem_value"] == "36.6")
    spec = acc._spec(row["model_hf_id"])
    assert abs(spec.total_params / 1e9 - 7.72) < 0.01
    setup = acc._train_setup(row, spec)
    assert (setup.seq_len, setup.micro_batch_size, setup.gradient_checkpointing) == (8192, 1, True)
    assert setup.attn_implementation == "flash_attention_2" and setup.weights_dtype == "bf16"
    assert setup.lora is not None and setup.lora.r == 64 and set(setup.lora.target_modules) == set(spec.block_linears)


def test_philschmid_fsdp_qlora_row_reads_as_the_posts_yaml(acc: ModuleType, rows) -> None:
    """llama_3_70b_fsdp_qlora.yaml: 4 x 24 GB, FSDP full_shard + offload, packed 3072 tokens, batch 1, nf4 base
    not upcast (TRL skips prepare_model_for_kbit_training for FSDP-sharded QLoRA), LoRA r=16 on every Linear."""
    row = rows["714"]
    spec = acc._spec(row["model_hf_id"])
    setup = acc._train_setup(row, spec)
    assert (setup.strategy, setup.num_gpus, setup.offload_params, setup.offload_optimizer) == ("fsdp", 4, True, True)
    assert (setup.seq_len, setup.micro_batch_size, setup.weights_dtype, setup.kbit_upcast) == (3072, 1, "nf4", False)
    assert setup.lora is not None and setup.lora.r == 16 and set(setup.lora.target_modules) == set(spec.block_linears)


def test_qwen25_speed_rows_read_as_the_docs_state(acc: ModuleType, rows) -> None:
    """Qwen2.5 speed benchmark: batch 1, 2048 generated tokens after the stated input, bf16 weights; the input-1 row
    of the 7B is its bf16 weights (7.62 B x 2 B = 14.19 GiB) plus a small cache, so the printed 'GB' is GiB."""
    row = next(r for r in rows.values() if r["source_group"] == "qwen25_speed_benchmark" and r["peak_mem_value"] == "19.97")
    spec = acc._spec(row["model_hf_id"])
    setup = acc._infer_setup(row, spec)
    assert (setup.seq_len, setup.new_tokens, setup.micro_batch_size, setup.weights_dtype) == (30720, 2048, 1, "bf16")
    assert acc._unit(row["peak_mem_unit"]) == 2**30
    assert abs(spec.total_params * 2 / 2**30 - 14.19) < 0.01


def test_peft_docs_fsdp_qlora_rows_read_as_the_script(acc: ModuleType, rows) -> None:
    """run_peft_qlora_fsdp.sh on 2 x 24 GB: packed 2048 tokens, batch 2, LoRA r=8 on every Linear, nf4 not upcast;
    one row with the yaml's CPU offload (19.6 GB), one without (35.6 GB); both per-parameter FSDP units (peft's
    fsdp_auto_wrap_policy)."""
    spec = acc._spec(rows["757"]["model_hf_id"])
    offload, resident = acc._train_setup(rows["757"], spec), acc._train_setup(rows["758"], spec)
    assert (offload.offload_params, resident.offload_params) == (True, False)
    for setup in (offload, resident):
        assert (setup.strategy, setup.num_gpus, setup.fsdp_version, setup.kbit_upcast) == ("fsdp", 2, 2, False)
        assert (setup.seq_len, setup.micro_batch_size, setup.lora.r if setup.lora else 0) == (2048, 2, 8)


def test_bnb_absmax_stays_whole_on_every_fsdp_rank(acc: ModuleType, rows) -> None:
    """FSDP shards and CPU-offloads parameters only; bnb's 4-bit absmax lives in Params4bit.quant_state (an attribute),
    so each rank holds all of it. Llama-2-70B by hand: Linears per layer 2*8192^2 (q, o) + 2*8192*1024 (k, v, GQA 8)
    + 3*8192*28672 (MLP) = 855,638,016; x 80 = 68,451,041,280 weights; /64 = 1,069,547,520 uint8 absmax;
    /256 = 4,177,920 fp32 second-level absmax (x 4 B): 1,086,259,200 B per GPU."""
    from perfguide.memory.analytic import replicated_quant_state, training_memory

    by_hand = 68_451_041_280 // 64 + 4 * (68_451_041_280 // 64 // 256)
    assert by_hand == 1_086_259_200
    offload, kept = rows["757"], rows["758"]   # PEFT docs FSDP + QLoRA, 2 GPUs: CPU offload on / off
    spec = acc._spec(offload["model_hf_id"])
    on, off = acc._train_setup(offload, spec), acc._train_setup(kept, spec)
    assert on.offload_params and not off.offload_params and on.num_gpus == off.num_gpus == 2
    assert replicated_quant_state(spec, on, offloaded=True) == by_hand             # weights on the CPU, the absmax all on the GPU
    assert replicated_quant_state(spec, off, offloaded=False) == by_hand - by_hand // 2   # the other rank's half on top of the even split
    bnb, ao = training_memory(spec, on), training_memory(spec, on, nf4_library="torchao")
    assert ao.weights == 0 and bnb.weights == by_hand               # torchao's NF4Tensor shards (and offloads) its scalers
    assert ao.cpu_ram - bnb.cpu_ram == by_hand // 2 * 2             # the share placed() had sent to host RAM, both ranks
    single = acc._train_setup(offload, spec).replace(strategy="ddp", offload_params=False, offload_optimizer=False)
    assert replicated_quant_state(spec, single, offloaded=False) == 0                # DDP replicates everything already


def test_fsdp1_no_sync_holds_every_gradient_shard(acc: ModuleType, rows) -> None:
    """litgpt accumulates under ``fabric.no_backward_sync`` (FSDP1 ``no_sync``), where FSDP1 "will accumulate the full
    model gradients (instead of gradient shards)": with use_orig_params=True LoRA that is a gradient for every
    weight, so on N ranks the held gradients are N times the 1/N share. Checked against the source's own rows: the
    13B LoRA run measures 35.57 GB on 4 x A100-40GB and OOMs on 2 (litgpt tutorials/resource-tables.md)."""
    from perfguide.memory.analytic import training_memory

    oom, four = rows["195"], rows["198"]
    spec = acc._spec(oom["model_hf_id"])
    two = acc._train_setup(oom, spec)
    assert two.fsdp_version == 1 and two.gradient_accumulation_steps > 1 and two.num_gpus == 2
    step = training_memory(spec, two.replace(gradient_accumulation_steps=1))
    assert training_memory(spec, two).gradients == 2 * step.gradients   # both ranks' halves held unsharded
    assert not acc._fits(oom, spec, two, acc._hardware(oom["gpu_type"], 2))
    setup4 = acc._train_setup(four, spec)
    measured = float(four["peak_mem_value"]) * 1e9
    assert abs(training_memory(spec, setup4).peak_allocated - measured) / measured < 0.05
    plans = training_memory(spec, two.replace(fsdp_version=2))       # FSDP2 (perfguide's plans) also holds unsharded
    assert plans.gradients < step.gradients                          # grads between micro-steps, but frozen weights get none


def test_logits_sum_loop_holds_gpt_neox_2024_cache_by_hand(acc: ModuleType, rows) -> None:
    """transformers SDPA tables (logits.sum() loop): fp16 logits + gradient (2 + 2 B per b*s*V) plus, for GPT-NeoX,
    the returned caches: the previous output's (fp32 rotated key 4 B per h + the fused qkv storage value views, 2 B per
    3h) and the current eager one's qkv storage (6) = 16 B per h per layer per token, and 4.42's fp32 q and k saved by
    eager attention (+4 B per h: tests/test_gpt_neox_fp32_rope.py); pythia-410m: h 1024, 24 layers, vocab 50304."""
    row = rows["347"]                              # pythia-410m-deduped, b 2 x s 1024, eager
    spec = acc._spec(row["model_hf_id"])
    setup = acc._train_setup(row, spec)
    assert (setup.micro_batch_size, setup.seq_len) == (2, 1024)
    tokens = 2 * 1024
    assert acc._loss_bytes(row, spec, setup) == 4 * tokens * 50304 + (16 + 4) * 1024 * 24 * tokens
    # biogpt: two contiguous key/value copies (4 B per h; h 1024, 24 layers, vocab 42384); opt the same (its 4.46
    # present = the contiguous key/value copies), and its table's release (4.46, PR #33298) also clamps the eager
    # scores with torch.max: + 2 B x b x 16 heads x s^2 x 24 blocks (tests/test_attention_era.py)
    for hub_id, vocab, per_h, era in (("microsoft/biogpt", 42384, 4 * 1024 * 24, 0),
                                      ("facebook/opt-350m", 50272, 4 * 1024 * 24, 2 * 16 * 24)):
        other = next(r for r in rows.values() if r["model_hf_id"] == hub_id and "logits.sum()" in r["method"])
        o_spec = acc._spec(hub_id)
        o_setup = acc._train_setup(other, o_spec)
        o_tokens = o_setup.micro_batch_size * o_setup.seq_len
        assert other["attn_impl"] == "eager"
        assert acc._loss_bytes(other, o_spec, o_setup) == (4 * o_tokens * vocab + per_h * o_tokens
                                                           + era * o_setup.micro_batch_size * o_setup.seq_len ** 2)


def test_biogpt_has_its_own_traced_block_not_the_generic_one() -> None:
    """BioGPT's block is OPT's pre-LN block with GELU instead of ReLU: GELU keeps fc1's output for its backward and
    fc2 keeps GELU's output (2 + 2 B per i, as GPT-NeoX's GELU MLP), ReLU only its output (2 B per i, OPT)."""
    from perfguide.memory.activations import family_coefficients

    bio, opt, neox = (family_coefficients("generic", t)["half"].per_token for t in ("biogpt", "opt", "gpt_neox"))
    assert bio["i"] == neox["i"] == 2 * opt["i"] == 4.0
    assert bio["h"] == opt["h"]


def test_trl_notebook_rows_read_as_its_two_configs(acc: ModuleType, rows) -> None:
    """TRL's sft_trl_lora_qlora notebook: the first version (28bba8c6b) trained Qwen3-8B at batch 2 with adamw_8bit on an
    A100 40GB; the 14B run (f6834206a) at batch 1 with paged_adamw_8bit, Liger and activation offloading on a Colab T4,
    whose CUDA total the notebook prints as 14.741 GB (gpus.json: 14.56-14.75 GiB on T4s)."""
    a, b = rows["2055"], rows["2056"]
    sa = acc._train_setup(a, acc._spec(a["model_hf_id"]))
    assert (sa.micro_batch_size, sa.gradient_accumulation_steps, sa.seq_len) == (2, 8, 1024)
    assert sa.optimizer == "adamw_bnb_8bit" and not sa.liger_kernel and not sa.activation_offloading
    assert sa.weights_dtype == "nf4" and sa.kbit_upcast and sa.kbit_recast_bf16 and not sa.kbit_recast_adapters
    assert sa.lora is not None and (sa.lora.r, sa.lora.alpha, len(sa.lora.target_modules)) == (32, 32, 7)
    sb = acc._train_setup(b, acc._spec(b["model_hf_id"]))
    assert (sb.micro_batch_size, sb.gradient_accumulation_steps) == (1, 4)
    assert sb.optimizer == "paged_adamw_8bit" and sb.liger_kernel and sb.activation_offloading
    t4 = acc._hardware(b["gpu_type"], 1).smallest_gpu.memory_total / 2**30
    assert 14.5 < t4 < 15.1
    assert acc._spec(b["model_hf_id"]).name == "Qwen/Qwen3-14B"   # Unsloth's 4-bit upload, priced by its config shape
    # the '~X GB VRAM' comments have no known config: listed, not compared
    assert acc.evaluate(rows["2059"], []).kind == "skip"


def test_torchtune_optimization_flags_rows_read_as_the_readme_ladder(acc: ModuleType, rows) -> None:
    """torchtune's README 'Optimization flags' table (1814feb17): Llama 3.2 3B, batch 2, packs of 4096 tokens, each flag
    added on top of the previous one; the unpacked baseline states no length, so it is listed, not compared. The
    model states are checked against the config's shape by hand: 128256 x 3072 tied embedding + 28 blocks of
    (2 x 3072^2 + 2 x 3072 x 1024 + 3 x 3072 x 8192 + 2 x 3072) + 3072 = 3,212,749,824 parameters."""
    assert acc.evaluate(rows["2074"], []).kind == "skip"
    n = 128256 * 3072 + 28 * (2 * 3072**2 + 2 * 3072 * 1024 + 3 * 3072 * 8192 + 2 * 3072) + 3072
    assert n == 3_212_749_824
    ckpt = rows["2078"]   # + checkpointing: torch AdamW (foreach), states in the weights' bf16
    s = acc._train_setup(ckpt, acc._spec(ckpt["model_hf_id"]))
    assert (s.micro_batch_size, s.seq_len, s.gradient_checkpointing, s.torch_compile) == (2, 4096, True, True)
    assert s.optimizer == "adamw_torch" and not s.optimizer_in_backward and not s.activation_offloading
    est = acc.estimate_memory(acc._spec(ckpt["model_hf_id"]), s, acc._hardware(ckpt["gpu_type"], 1))
    assert est.weights == 2 * n and est.optimizer_states == 4 * n
    eight = rows["2081"]  # + 8-bit AdamW: on the device (not the paged variant), stepped in backward, offloaded
    s8 = acc._train_setup(eight, acc._spec(eight["model_hf_id"]))
    assert s8.optimizer == "adamw_bnb_8bit" and s8.optimizer_in_backward and s8.activation_offloading
    q = rows["2083"]
    sq = acc._train_setup(q, acc._spec(q["model_hf_id"]))
    assert sq.weights_dtype == "nf4" and not sq.kbit_upcast and not sq.optimizer_in_backward
    assert sq.lora is not None and (sq.lora.r, sq.lora.alpha, len(sq.lora.target_modules)) == (64, 128, 6)


def test_torchtune_lora_rows_train_adapters_in_the_run_dtype(acc: ModuleType, rows) -> None:
    """torchtune instantiates the model, LoRA's lora_a / lora_b included, under set_default_dtype(bf16) and runs no
    peft: row 2082's adapters (rank 64 on q, v, output_proj, w1, w2, w3 of 28 blocks: 28 x 64 x (6144 + 4096 + 6144 +
    3 x 11264) = 89,915,392 parameters) are bf16, 2 bytes each, not peft's fp32 upcast."""
    r = rows["2082"]
    spec = acc._spec(r["model_hf_id"])
    s = acc._train_setup(r, spec)
    assert s.lora is not None and s.lora.autocast_adapter_dtype is False and s.lora.adapter_dtype == "bf16"
    n = 28 * 64 * (6144 + 4096 + 6144 + 3 * 11264)
    assert n == 89_915_392
    hw = acc._hardware(r["gpu_type"], 1)
    fp32 = s.replace(lora=s.lora.model_copy(update={"autocast_adapter_dtype": True, "adapter_dtype": None}))
    assert acc.estimate_memory(spec, fp32, hw).weights - acc.estimate_memory(spec, s, hw).weights == 2 * n
    # the QLoRA row too: torchao's to_nf4 quantizes the base Linears after they are built; the adapters stay bf16
    q = acc._train_setup(rows["2083"], spec)
    assert q.weights_dtype == "nf4" and q.lora is not None and q.lora.adapter_dtype == "bf16"
    as_peft = q.replace(lora=q.lora.model_copy(update={"adapter_dtype": None}))   # peft's fp32 adapters on a 4-bit base
    assert acc.estimate_memory(spec, as_peft, hw).gradients - acc.estimate_memory(spec, q, hw).gradients == 2 * n
    peft = rows["2055"]   # a peft row of 2025 (peft 0.17): its adapters are still upcast to fp32
    peft_lora = acc._train_setup(peft, acc._spec(peft["model_hf_id"])).lora
    assert peft_lora.autocast_adapter_dtype is True and peft_lora.adapter_dtype is None


def test_optimum_gptq_rows_load_the_checkpoint_as_stored(acc: ModuleType, rows) -> None:
    """optimum's benchmark_gptq.py on TheBloke/Llama-2-13B-chat-GPTQ (AutoGPTQ 4-bit, group 128, fp16 activations):
    read as the GPTQ checkpoint it loads, whose weights are the fp16 twin's less what 4-bit packing saves. By hand:
    12,687,769,600 block-Linear weights at 4 bits plus one fp16 scale and one 4-bit zero per 128 of them, and the
    fp16 embedding and head (2 x 163,840,000 x 2 B)."""
    gptq, fp16 = rows["563"], rows["562"]
    spec = acc._spec(gptq["model_hf_id"])
    setup = acc._infer_setup(gptq, spec)
    assert (setup.checkpoint_format, setup.weights_dtype, setup.seq_len, setup.micro_batch_size) == ("gptq", "fp16", 512, 1)
    by_hand = 12_687_769_600 * (0.5 + 2.5 / 128) + 2 * 163_840_000 * 2
    est = acc.estimate_memory(spec, setup, None)
    assert est.weights == pytest.approx(by_hand, rel=0.01)
    plain = acc.estimate_memory(acc._spec(fp16["model_hf_id"]), acc._infer_setup(fp16, acc._spec(fp16["model_hf_id"])), None)
    assert plain.weights - est.weights == pytest.approx(12_687_769_600 * (2 - 0.5 - 2.5 / 128), rel=0.01)
