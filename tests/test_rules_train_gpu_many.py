"""train_gpu_many rules: layout ladder (DDP -> ZeRO-1/2 / SHARD_GRAD_OP -> ZeRO-3 / FULL_SHARD -> offload), the fixed
global batch, interconnect-aware step time, LoRA/QLoRA compatibility, forced strategies, the no-fit path, adapters.

Bytes that decide a layout are computed here from hand-counted parameter totals and the published per-GPU formulas
(ZeRO paper / DeepSpeed's estimate_zero2/3_model_states_mem_needs: DeepSpeed keeps 16-bit params, 16-bit grads and
fp32 master + fp32 grads + Adam m, v = 2 + 2 + 4 + 4 + 8 bytes; FSDP2 with AMP keeps fp32 params, fp32 grads and
Adam m, v = 4 + 4 + 8). Hardware is hand-built from the datasheets unless a named target is the point of the test.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_speed import A100, CPU32, GPT2_TOTAL, LLAMA_TOTAL, GiB, gpt2, llama7b

import perfguide
from perfguide.errors import ConflictingConstraintsError, PerfGuideError
from perfguide.hardware.types import GPU, Hardware
from perfguide.model.types import ModelSpec
from perfguide.scenarios.strategies import comm_bytes
from perfguide.scenarios.train_gpu_many import plan
from perfguide.scenarios.types import Constraints, Plan, Request

# Llama-2-70B by hand: embed + head 2 x 32000 x 8192; 80 blocks of q,o 8192^2, k,v 8192x1024 (GQA 8 heads), 3 MLP 8192x28672,
# 2 RMSNorms; final norm
LLAMA70_TOTAL = 2 * 32000 * 8192 + 80 * (2 * 8192 * 8192 + 2 * 8192 * 1024 + 3 * 8192 * 28672 + 2 * 8192) + 8192
assert LLAMA70_TOTAL == 68_976_648_192
# Llama-3.2-1B by hand: tied 128256 x 2048 embedding; 16 blocks of q,o 2048^2, k,v 2048x512, 3 MLP 2048x8192, 2 norms; final norm
LLAMA1B_TOTAL = 128256 * 2048 + 16 * (2 * 2048 * 2048 + 2 * 2048 * 512 + 3 * 2048 * 8192 + 2 * 2048) + 2048
assert LLAMA1B_TOTAL == 1_235_814_400


def box(n: int = 8, nodes: int = 1, link: str = "nvlink", bw: float = 300.0, gpu: GPU = A100, ram_gib: int | None = None,
        source: str = "named") -> Hardware:
    """n GPUs per node; NVLink3 on A100 SXM = 600 GB/s both ways = 300 per direction; PCIe 4.0 x16 = 32 per direction."""
    cpu = CPU32 if ram_gib is None else CPU32.model_copy(update={"ram_total": ram_gib * GiB, "ram_available": ram_gib * GiB})
    return Hardware(gpus=tuple(gpu.model_copy(update={"index": i}) for i in range(n)), cpu=cpu, interconnect=link,
                    intra_node_bandwidth_gbps=bw, inter_node_bandwidth_gbps=50.0 if nodes > 1 else None, nodes=nodes,
                    source=source, name="test box")


def run(spec: ModelSpec | None = None, hw: Hardware | None = None, seq: int = 1024, batch: int = 64, **cons: object) -> Plan:
    return plan(Request(scenario="train_gpu_many", model=spec or gpt2(), hardware=hw or box(), seq_len=seq,
                        global_batch_size=batch, constraints=Constraints(**cons)))


def decision(p, setting: str):
    return next(d for d in p.decisions if d.setting == setting)


def states(c) -> int:
    return c.memory.weights + c.memory.gradients + c.memory.optimizer_states


def layout_candidate(p: Plan, strategy: str, offload: bool = False):
    """The exact-AMP fused-AdamW candidate of a layout (the one the strategy comparison prices)."""
    return next(c for c in p.candidates if c.setup.strategy == strategy and c.setup.offload_optimizer == offload
                and c.setup.optimizer == "adamw_torch_fused" and c.setup.weights_dtype == "fp32" and c.setup.lora is None
                and c.setup.gradient_checkpointing == p.setup.gradient_checkpointing)


# --- per-GPU bytes of each layout, by hand ------------------------------------------------------------------

P, N = GPT2_TOTAL, 8
HAND_STATES = {
    "ddp": 4 * P + 4 * P + 8 * P,                 # full fp32 replica: params, grads, Adam m + v
    "zero1": 2 * P + 2 * P + (4 + 4 + 8) * P / N,  # 16-bit params and grads whole; master, fp32 grads, m, v sharded
    "zero2": 2 * P + (2 + 4 + 4 + 8) * P / N,      # DeepSpeed's 2 + 18/N
    "zero3": (2 + 2 + 4 + 4 + 8) * P / N,          # DeepSpeed's 18/N
    "fsdp": (4 + 4 + 8) * P / N,                   # FULL_SHARD: everything fp32 and sharded
    # SHARD_GRAD_OP shards the same fp32 states (FSDP2 keeps the sharded DTensor as the source of truth); the
    # 16-bit unsharded copy kept from forward to backward is a buffer on top
    "fsdp_shard_grad_op": (4 + 4 + 8) * P / N,
}


@pytest.fixture(scope="module")
def gpt2_plan() -> Plan:
    return run(gpt2(), box(8))


@pytest.mark.parametrize("strategy", list(HAND_STATES))
def test_candidates_carry_hand_derived_per_gpu_model_states(gpt2_plan: Plan, strategy: str) -> None:
    assert states(layout_candidate(gpt2_plan, strategy)) == pytest.approx(HAND_STATES[strategy], rel=1e-3)


def test_shard_grad_op_keeps_the_16bit_unsharded_copy(gpt2_plan: Plan) -> None:
    assert layout_candidate(gpt2_plan, "fsdp_shard_grad_op").memory.other >= 2 * P


def test_zero_stage_bytes_agree_with_deepspeed_estimators(gpt2_plan: Plan) -> None:
    ds2 = pytest.importorskip("deepspeed.runtime.zero.stage_1_and_2")
    ds3 = pytest.importorskip("deepspeed.runtime.zero.stage3")
    p = gpt2_plan
    _, gpu2 = ds2.estimate_zero2_model_states_mem_needs(total_params=GPT2_TOTAL, num_gpus_per_node=8, num_nodes=1, cpu_offload=False)
    _, gpu3, largest = ds3.estimate_zero3_model_states_mem_needs(total_params=GPT2_TOTAL, largest_layer_params=0, num_gpus_per_node=8,
                                                                 num_nodes=1, cpu_offload=False)
    assert largest == 0
    assert states(layout_candidate(p, "zero2")) == pytest.approx(gpu2, rel=1e-3)
    # ZeRO-3: DeepSpeed's estimator counts 18/N (16-bit params 2 + fp32 master 4 + fp32 grads 4 + Adam 8); stage3.py also
    # keeps the reduced gradient partition in grad_partitions_flat_buffer (gradient_accumulation_dtype, 16-bit by default:
    # 2/N), which perfguide counts on top
    assert states(layout_candidate(p, "zero3")) == pytest.approx(gpu3 + 2 * GPT2_TOTAL / 8, rel=1e-3)


def test_rules_pick_the_level_the_hand_bytes_allow() -> None:
    usable = 0.9 * 80 * GiB
    # Llama-2-7B on 8 x A100-80GB: DDP 16 B/param = 107.8 GB > 77.3 GB usable; ZeRO-2 2 + 18/8 = 4.25 B/param = 28.6 GB fits
    assert 16 * LLAMA_TOTAL > usable and (2 + 18 / 8) * LLAMA_TOTAL < usable / 2
    p = run(llama7b(), box(8), seq=2048, batch=32)
    # at the fastest split (micro-batch 2 x 2 accumulation) SHARD_GRAD_OP also holds its unsharded 16-bit gradients
    # between micro-steps (accelerate's no_sync / FSDP2 set_requires_gradient_sync), so FULL_SHARD ties it on speed
    assert p.fits and p.setup.strategy in ("zero1", "zero2", "fsdp_shard_grad_op", "fsdp")
    assert (p.setup.weights_dtype, p.setup.optimizer) == ("fp32", "adamw_torch_fused")  # sharding before changing semantics
    ddp = [c for c in p.candidates if c.setup.strategy == "ddp" and c.setup.lora is None]
    assert ddp and all(c.verdict == "does-not-fit" and c.memory.needed > usable for c in ddp)
    # 70B on 4 nodes x 8 H100-80GB: 2 B/param of whole 16-bit params alone (138 GB) rule out level 1;
    # FULL_SHARD 16 B/param / 32 = 34.5 GB fits; ZeRO-3 (18/32) fits too and ties, so the tie-break keeps FSDP2
    h100 = A100.model_copy(update={"name": "H100-SXM5-80GB", "bf16_tflops": 989, "fp16_tflops": 989, "memory_bandwidth_gbps": 3350})
    spec70 = ModelSpec.from_any("meta-llama/Llama-2-70b-hf")
    assert spec70.total_params == LLAMA70_TOTAL and 2 * LLAMA70_TOTAL > 80 * GiB
    p70 = run(spec70, box(8, nodes=4, bw=450.0, gpu=h100), seq=2048, batch=64)
    assert p70.fits and p70.setup.strategy == "fsdp" and not p70.setup.offload_optimizer
    assert decision(p70, "sharding_backend").value == "FSDP2"
    z3 = decision(p70, "sharding_backend").alternatives
    assert any(a.value == "zero3" for a in z3)


# --- the named cases -------------------------------------------------------------------------------

def test_gpt2_on_a100_80gb_x8_is_the_fastest_fitting_layout_with_launcher_and_dataparallel_warning() -> None:
    rec = perfguide.recommend("openai-community/gpt2", scenario="train_gpu_many", hardware="a100-80gb:8", global_batch_size=64)
    s = rec.setup
    assert rec.fits and not s.offload_optimizer and (s.num_gpus, s.nodes) == (8, 1)
    assert s.micro_batch_size * s.gradient_accumulation_steps * 8 == 64
    strat = rec.decision("strategy")
    assert strat.value == s.strategy and strat.number == rec.memory.device_total
    # every on-GPU layout keeps the training the same, so the pick is the fastest that fits (a replica fits one GPU,
    # so DDP is among them): none of the others that fit is predicted faster by more than the sharding tie tolerance
    same = [c for c in rec.candidates if c.verdict == "fits" and c.setup.lora is None and c.setup.weights_dtype == s.weights_dtype
            and not c.setup.offload_optimizer and c.setup.optimizer == s.optimizer]
    assert any(c.setup.strategy == "ddp" for c in same)
    assert all(c.throughput.step_time_s >= rec.throughput.step_time_s * (1 - 0.011) for c in same)
    # every other layout is listed with its per-GPU bytes
    assert {a.value for a in strat.alternatives} | {s.strategy} >= {"ddp", "zero1", "zero2", "zero3", "fsdp", "fsdp_shard_grad_op"}
    assert all(a.number and a.unit == "bytes per GPU" for a in strat.alternatives)
    launcher = rec.decision("launcher")
    assert "accelerate launch --num_processes 8" in launcher.value and launcher.number == 8
    assert any("python" in w and "DataParallel" in w for w in rec.warnings)


def test_llama2_7b_full_finetune_on_a100_80gb_x8_is_sharded() -> None:
    # fp32 master + fp32 grads + 2 fp32 Adam states = 16 B/param: 16 x 6.74e9 = 107.8 GB > 80 GB, so no full replica
    assert 16 * 6.74e9 > 80e9
    rec = perfguide.recommend("meta-llama/Llama-2-7b-hf", scenario="train_gpu_many", hardware="a100-80gb:8", global_batch_size=32)
    assert rec.fits and rec.setup.strategy in ("zero1", "zero2", "zero3", "fsdp", "fsdp_shard_grad_op")
    assert rec.setup.lora is None
    ddp = next(a for a in rec.decision("strategy").alternatives if a.value == "ddp")
    assert "does not fit" in ddp.why_not and ddp.number > 80 * GiB * 0.9


def test_llama2_70b_on_h100_x8x2_shards_fully_and_offload_respects_host_ram() -> None:
    rec = perfguide.recommend("meta-llama/Llama-2-70b-hf", scenario="train_gpu_many", hardware="h100-80gb:8x2", global_batch_size=32,
                               host_ram="256GiB")
    assert rec.fits and rec.setup.strategy in ("zero3", "fsdp") and rec.setup.world_size == 16
    ram = rec.hardware.cpu.ram_available
    # exact-AMP FSDP offload puts all 16 B/param of the node's half of the model in its RAM: 16 x 69e9 / 2 = 552 GB
    need = 16 * LLAMA70_TOTAL / 2
    assert need > 0.9 * ram
    # an on-GPU rung (lighter AdamW states / pure bf16) fits, so offload is not reached (docs/concepts.md: rung 5)
    assert not (rec.setup.offload_params or rec.setup.offload_optimizer)
    # where offload is reached (Mixtral-8x7B on 4x A100, a 256 GiB host), every layout whose offloaded states exceed
    # the usable host RAM is refused for it, with the host-RAM figure as the reason
    mix = perfguide.recommend("mistralai/Mixtral-8x7B-v0.1", scenario="train_gpu_many", hardware="a100-80gb:4", host_ram="256GiB")
    usable = 0.9 * mix.hardware.cpu.ram_available
    over = [c for c in mix.candidates if (c.setup.offload_params or c.setup.offload_optimizer) and c.memory.cpu_ram > usable
            and c.memory.needed <= 0.9 * c.memory.capacity    # the GPU side fits: host RAM is what rules it out
            and c.verdict != "incompatible"]                        # (pure bf16 + ZeRO-Offload is refused before pricing)
    assert over and all(c.verdict == "does-not-fit" and "host RAM" in c.why for c in over)
    # exact AMP offload of Mixtral needs 16 B/param of the model in host RAM: by hand 16 x 46.7e9 > 256 GiB
    exact = [c for c in over if c.setup.weights_dtype == "fp32" and c.setup.optimizer == "adamw_torch_fused"]
    assert exact and all(c.memory.cpu_ram >= 16 * 46.7e9 * 0.95 for c in exact if not c.setup.activation_offloading)
    # with 2 TiB of host RAM per node the exact-AMP offload would fit, but CPU offload is the ladder's rung after
    # lighter AdamW states and pure bf16 (docs/concepts.md), and one of those fits on the GPUs: it is chosen
    named = rec.hardware
    roomy = named.model_copy(update={"cpu": named.cpu.model_copy(update={"ram_total": 2048 * GiB, "ram_available": 2048 * GiB})})
    p = run(rec.model, roomy, seq=rec.request.seq_len, batch=32)
    assert p.fits and p.setup.strategy in ("zero3", "fsdp") and not (p.setup.offload_optimizer or p.setup.offload_params)
    assert (p.setup.weights_dtype, p.setup.optimizer) != ("fp32", "adamw_torch_fused")
    assert p.memory.needed <= 0.9 * p.memory.capacity


def test_pcie_slows_zero3_more_than_ddp() -> None:
    spec = ModelSpec.from_any("meta-llama/Llama-3.2-1B")
    assert spec.total_params == LLAMA1B_TOTAL
    pinned = dict(seq=512, batch=64, micro_batch_size=1, gradient_checkpointing=False, optimizer="adamw_torch_fused")
    step = {(strat, link): run(spec, box(8, link=link, bw=bw), strategy=strat, **pinned)
            for strat in ("ddp", "zero3") for link, bw in (("nvlink", 300.0), ("pcie", 32.0))}
    for (strat, _), p in step.items():
        assert p.setup.strategy == strat and p.setup.gradient_accumulation_steps == 8
    delta = {s: step[(s, "pcie")].throughput.step_time_s - step[(s, "nvlink")].throughput.step_time_s for s in ("ddp", "zero3")}
    assert delta["zero3"] > delta["ddp"] > 0
    # why: per step ZeRO-3 gathers bf16 params twice and scatters bf16 grads every micro-batch (8 x 6 B/param),
    # DDP all-reduces fp32 grads once (2 x 4 B/param); each ring pass sends 7/8 of the payload
    P = LLAMA1B_TOTAL
    assert comm_bytes(spec, step[("zero3", "pcie")].setup) == pytest.approx(8 * (2 * 2 + 2) * P * 7 / 8, rel=1e-6)
    assert comm_bytes(spec, step[("ddp", "pcie")].setup) == pytest.approx(2 * 4 * P * 7 / 8, rel=1e-6)
    assert any("pcie" in w and "zero3" in w for w in step[("zero3", "pcie")].warnings)
    assert not any("no NVLink" in w for w in step[("ddp", "pcie")].warnings)


@settings(max_examples=25, deadline=None)
@given(per_node=st.sampled_from([1, 2, 4, 8]), nodes=st.sampled_from([1, 2, 4]), k=st.integers(1, 48))
def test_micro_x_accumulation_x_world_is_the_global_batch(per_node: int, nodes: int, k: int) -> None:
    world = per_node * nodes
    p = run(gpt2(), box(8, nodes=nodes), seq=256, batch=world * k, num_gpus=per_node)
    s = p.setup
    assert s.world_size == world
    assert s.micro_batch_size * s.gradient_accumulation_steps * s.world_size == world * k
    # a candidate that splits each sequence over sp ranks counts it once per group (Trainer.get_total_train_batch_size)
    assert all(c.setup.micro_batch_size * c.setup.gradient_accumulation_steps * c.setup.world_size
               == world * k * c.setup.sequence_parallel for c in p.candidates)


def test_global_batch_not_a_multiple_of_world_is_one_line_error() -> None:
    with pytest.raises(ConflictingConstraintsError, match="multiple of the world size 16") as err:
        run(gpt2(), box(8, nodes=2), batch=40)
    assert "\n" not in str(err.value) and "32 or 48" in str(err.value)


def test_nodes_and_num_gpus_constraints_set_the_world() -> None:
    rec = perfguide.recommend("openai-community/gpt2", scenario="train_gpu_many", hardware="a100-80gb:8", nodes=2, num_gpus=4,
                              global_batch_size=64)
    assert (rec.setup.num_gpus, rec.setup.nodes, rec.setup.world_size) == (4, 2, 8)
    assert "--num_machines 2" in rec.decision("launcher").value
    with pytest.raises(ConflictingConstraintsError, match="num_gpus"):
        run(gpt2(), box(8), num_gpus=16)


def test_probed_free_memory_decides_the_layout() -> None:
    # a probe seeing only 20 GiB free per GPU (other jobs): a 7B replica cannot fit, a full shard (16 B/param / 8 = 13.5 GB) can
    busy = box(8, source="probe")
    busy = busy.model_copy(update={"gpus": tuple(g.model_copy(update={"memory_free": 20 * GiB}) for g in busy.gpus)})
    assert 16 * LLAMA_TOTAL / 8 < 20 * GiB * 0.9 < (2 + 18 / 8) * LLAMA_TOTAL
    p = run(llama7b(), busy, seq=1024, batch=64)
    assert p.fits and p.setup.strategy in ("fsdp", "zero3") and p.memory.needed <= 0.9 * 20 * GiB


# --- constraints, compatibility, no-fit -------------------------------------------------------------------

@pytest.mark.parametrize("strategy", ["zero1", "zero2", "zero3", "fsdp", "fsdp_shard_grad_op"])
def test_forced_strategy_is_honoured(strategy: str) -> None:
    p = run(gpt2(), box(8), strategy=strategy)
    assert p.fits and p.setup.strategy == strategy
    assert decision(p, "strategy").reason.startswith(f"strategy={strategy!r} was requested")


@pytest.mark.parametrize("cons,match", [
    ({"strategy": "single"}, "train_gpu_one"),
    ({"strategy": "tp"}, "Accepted"),
])
def test_bad_forced_strategies_conflict(cons: dict, match: str) -> None:
    with pytest.raises(PerfGuideError, match=match) as err:
        run(gpt2(), box(8), **cons)
    assert "\n" not in str(err.value)


def test_qlora_layouts_ddp_fsdp_zero3_with_quant_storage_and_zero12_with_uint8() -> None:
    ddp = run(llama7b(), box(8), seq=1024, batch=64, finetune="qlora")
    # a replicated 4-bit base: DDP, or ZeRO-1 where DeepSpeed's bf16 engine casts peft's fp32 upcast back (memory/kbit.py)
    # and the bf16 stream drops the per-Linear casts of the fp32 one (1.27 vs 1.44 s/step here)
    assert ddp.setup.weights_dtype == "nf4" and ddp.setup.strategy in ("ddp", "zero1")
    verdicts = {c.setup.strategy: c.verdict for c in ddp.candidates if c.setup.weights_dtype == "nf4" and not c.setup.offload_optimizer}
    # ZeRO-1/2 run QLoRA: DeepSpeed's module.bfloat16() casts floating tensors only (torch Module docs), so bnb's uint8
    # packed weights survive; the plan says to keep that default storage
    assert verdicts["zero2"] != "incompatible" and verdicts["zero1"] != "incompatible"
    z2 = run(llama7b(), box(8), seq=1024, batch=64, finetune="qlora", strategy="zero2")
    assert z2.fits and z2.setup.strategy == "zero2" and decision(z2, "bnb_4bit_quant_storage").value == "uint8"
    # the 4-bit base is not partitioned by ZeRO-1/2: every rank holds all of it, as under DDP (0.5 B + absmax per weight)
    assert z2.memory.weights > 0.5 * 6.0e9
    # PEFT's documented recipes: QLoRA + FSDP and QLoRA + ZeRO-3, both with bnb_4bit_quant_storage
    assert verdicts["fsdp"] != "incompatible" and verdicts["zero3"] != "incompatible"
    fsdp = run(llama7b(), box(8), seq=1024, batch=64, finetune="qlora", strategy="fsdp")
    assert fsdp.setup.strategy == "fsdp" and decision(fsdp, "bnb_4bit_quant_storage").value == "bf16"


def test_impossible_case_suggests_more_nodes() -> None:
    a100_40 = A100.model_copy(update={"memory_total": 40 * GiB, "memory_free": 40 * GiB})
    # 70B full fine-tune on 2 x 40 GB: even 16-bit params alone (138 GB) exceed both GPUs; offload needs 16 B/param = 1.1 TB > 500 GiB RAM
    assert 2 * LLAMA70_TOTAL > 2 * 40 * GiB and 16 * LLAMA70_TOTAL > 500 * GiB
    p = run(ModelSpec.from_any("meta-llama/Llama-2-70b-hf"), box(2, gpu=a100_40), seq=2048, batch=32)
    assert not p.fits
    text = " ".join(p.suggestions)
    assert "nodes=" in text and "qlora" in text
    # the closest plan may split its sequences: the Trainer counts a sequence once per group of sp ranks
    assert p.setup.micro_batch_size * p.setup.gradient_accumulation_steps * 2 == 32 * p.setup.sequence_parallel


def test_offload_not_offered_when_disallowed() -> None:
    p = run(ModelSpec.from_any("meta-llama/Llama-2-70b-hf"), box(8, ram_gib=2048), seq=2048, batch=32, allow_offload=False)
    assert not p.setup.offload_optimizer and not p.setup.offload_params
    assert not any(c.verdict in ("fits", "chosen") and c.setup.offload_optimizer for c in p.candidates)


# --- the plan reaches F's adapters -----------------------------------------------------------------------

def test_adapters_carry_the_strategy() -> None:
    rec = perfguide.recommend("meta-llama/Llama-2-70b-hf", scenario="train_gpu_many", hardware="h100-80gb:8x4", global_batch_size=64)
    assert rec.setup.strategy == "fsdp"
    args = rec.training_args_dict()
    assert args["fsdp"] is True and args["fsdp_config"]["reshard_after_forward"] is True and "deepspeed" not in args
    cfg = rec.accelerate_config()
    assert (cfg["distributed_type"], cfg["num_processes"], cfg["num_machines"]) == ("FSDP", 32, 4)
    cmd = rec.launch_command("train.py")
    assert cmd.startswith("accelerate launch") and "--num_processes 32" in cmd and "--num_machines 4" in cmd and "--use_fsdp" in cmd
    z2 = perfguide.recommend("meta-llama/Llama-2-7b-hf", scenario="train_gpu_many", hardware="a100-80gb:8", strategy="zero2",
                             global_batch_size=32)
    assert z2.training_args_dict()["deepspeed"]["zero_optimization"]["stage"] == 2
    assert z2.accelerate_config()["distributed_type"] == "DEEPSPEED"
    ddp = perfguide.recommend("openai-community/gpt2", scenario="train_gpu_many", hardware="a100-80gb:8", global_batch_size=64,
                              strategy="ddp")
    assert ddp.accelerate_config()["distributed_type"] == "MULTI_GPU" and "--multi_gpu" in ddp.launch_command("train.py")


@pytest.mark.parametrize("model", ["meta-llama/Llama-3.1-70B", "Qwen/Qwen2.5-72B"])
@pytest.mark.parametrize("hardware", ["rtx4090:2", "rtx3090:2"])
def test_70b_qlora_on_two_24gb_cards_runs_as_the_published_recipes(model: str, hardware: str) -> None:
    """Answer.AI's fsdp_qlora (--use_cpu_offload) and axolotl's qlora-fsdp-70b.yaml (fsdp_offload_params: true)
    train a 70B QLoRA on two 24 GB cards. By hand: ~70e9 weights x 0.5 B of NF4 is ~33 GiB, ~16 GiB per card
    sharded over two, before the bf16-gathered layer, activations and the CUDA context: on the edge of 21.6 GiB
    usable, so the plan must shard and offload, and the host holds at least the 4-bit base."""
    rec = perfguide.recommend(model, scenario="train_gpu_many", hardware=hardware, finetune="qlora")
    assert rec.fits and rec.memory.fits
    s = rec.setup
    assert s.weights_dtype == "nf4" and s.shards_params and (s.offload_params or rec.memory.needed <= 0.9 * 24 * GiB)
    if s.offload_params:
        assert rec.memory.cpu_ram >= 0.5 * rec.model.total_params * 0.9
        offload = decision(rec, "offload")
        assert "fsdp_qlora" in offload.source
    assert rec.memory.needed <= 0.9 * 24 * GiB


def test_no_one_edit_layout_change_that_fits_is_faster_than_the_pick() -> None:
    """The search gap of issue 23: TRL's FSDP2 recipe (Qwen2.5-0.5B, 8 x H100, 4096 tokens). recommend used to stop at the
    first layout level that fit (DDP) while its own estimate priced FSDP at ~25% more tokens/s. Now every on-GPU layout of
    a semantics rung is ranked together: no single change of strategy and micro-batch that fits is faster than the pick
    by more than the sharding tie tolerance (1%)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rec = perfguide.recommend("Qwen/Qwen2.5-0.5B", "train_gpu_many", hardware="h100-80gb:8", seq_len=4096)
        s = rec.setup
        per_rank = s.micro_batch_size * s.gradient_accumulation_steps
        for strategy in ("ddp", "zero1", "zero2", "fsdp_shard_grad_op", "zero3", "fsdp"):
            for micro in (m for m in (1, 2, 4, 8, 16, 32) if per_rank % m == 0):
                edit = s.replace(strategy=strategy, micro_batch_size=micro, gradient_accumulation_steps=per_rank // micro)
                mem = perfguide.estimate("Qwen/Qwen2.5-0.5B", edit, hardware="h100-80gb:8")
                if not mem.fits:
                    continue
                t = perfguide.estimate_speed("Qwen/Qwen2.5-0.5B", edit, hardware="h100-80gb:8").step_time_s
                assert t >= rec.throughput.step_time_s * (1 - 0.011), (edit.label, t, rec.throughput.step_time_s)


def test_more_nodes_suggestion_names_a_hardware_string_that_parses() -> None:
    # Llama-3.1-8B full fine-tune on 2 x RTX 4090 does not fit (16 GB of bf16 weights alone, plus grads and AdamW
    # states, over 2 x 24 GB even sharded with the host RAM of the default node); the "more nodes" suggestion must
    # be a target the user can pass back, 'rtx4090:2x2' (2 per node, 2 nodes), not a '...' placeholder
    import re

    import perfguide
    from perfguide import Hardware

    rec = perfguide.recommend("meta-llama/Llama-3.1-8B", scenario="train_gpu_many", hardware="rtx4090:2")
    assert not rec.fits
    more = [s for s in rec.suggestions if s.startswith("nodes=")]
    assert more and "'...:" not in more[0]
    name = re.search(r"hardware='([^']+)'", more[0])
    assert name is not None
    hw = Hardware.from_name(name.group(1))
    assert (hw.smallest_gpu.name, hw.gpu_count) == ("rtx4090", 2) and hw.nodes == int(more[0].split()[0].split("=")[1])
