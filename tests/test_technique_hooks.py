"""A technique's memory and speed effects live in its own module: the cost model (memory/, speed/) folds the
techniques' hooks and never reads a technique's Setup switch itself. Parsed with ast, so the rule is enforced,
not just followed; the checker is tested on a fake file so it cannot pass by looking at nothing."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

try:
    from helpers import hardware, tiny_spec
except ImportError:  # pragma: no cover - run from the repository root
    from tests.helpers import hardware, tiny_spec

from perfguide import techniques
from perfguide.memory.sharding import PerDevice
from perfguide.setup import Setup
from perfguide.techniques.activation_offloading import split_boundaries
from perfguide.techniques.base import Technique
from perfguide.techniques.liger_kernel import chunk_rows

PACKAGE = Path(techniques.__file__).resolve().parents[1]
COST_MODEL = sorted(p for layer in ("memory", "speed") for p in (PACKAGE / layer).rglob("*.py"))
HOOKS = ("place", "shape", "step_shape", "memory", "kernel_factors", "speed", "per_rank", "sequence_ranks")
#: fields a hooked technique owns that the core physics prices for every setup: which optimizer (its state is the
#: optimizer ledger, memory/optimizers.py), the KV cache layout of inference, the data's mean sample length
CORE_FIELDS = frozenset({"optimizer", "cache_implementation", "avg_seq_len"})
#: the inference path has no technique hooks yet: accelerate's big-model offload (``device_map`` with
#: ``offload_params``) is still priced where the inference memory and speed are
INFERENCE_OFFLOAD = {"memory/inference.py": {"offload_params"}, "speed/inference.py": {"offload_params"}}


def hooked(t: Technique) -> bool:
    return any(getattr(type(t), h) is not getattr(Technique, h) for h in HOOKS)


def forbidden_fields() -> set[str]:
    return {f for t in techniques.registry() if hooked(t) for f in t.fields} - CORE_FIELDS


def violations(path: Path, fields: set[str]) -> list[str]:
    """Reads of a hooked technique's field (attribute or string key) and ``x.autocast == "fp8"`` tests."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Attribute) and node.attr in fields:
            found.append(f"line {node.lineno}: .{node.attr}")
        elif isinstance(node, ast.Constant) and node.value in fields:
            found.append(f"line {node.lineno}: {node.value!r}")
        elif isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(isinstance(s, ast.Attribute) and s.attr == "autocast" for s in sides) and \
                    any(isinstance(s, ast.Constant) and s.value == "fp8" for s in sides):
                found.append(f"line {node.lineno}: autocast == 'fp8'")
    return found


def test_the_hooked_techniques_own_the_switches() -> None:
    """Guard against the scan below passing because the registry lost its hooks."""
    assert {"liger_kernel", "padding_free", "activation_offloading", "optimizer_in_backward", "torch_compile",
            "gradient_checkpointing", "offload_optimizer", "offload_params"} <= forbidden_fields()
    assert {t.name for t in techniques.registry() if hooked(t)} >= {"fp8", "optimizer", "liger_kernel", "padding_free",
                                                                     "gradient_checkpointing", "cpu_offload"}


@pytest.mark.parametrize("path", COST_MODEL, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_cost_model_reads_no_technique_switch(path: Path) -> None:
    bad = violations(path, forbidden_fields() - INFERENCE_OFFLOAD.get(path.relative_to(PACKAGE).as_posix(), set()))
    assert not bad, f"{path.relative_to(PACKAGE)} reads a technique's field; move the effect into its hook: " + ", ".join(bad)


def test_the_checker_sees_attributes_keys_and_fp8(tmp_path: Path) -> None:
    fake = tmp_path / "probe.py"
    fake.write_text("def f(setup):\n    a = setup.liger_kernel\n    b = setup.model_copy(update={'padding_free': False})\n"
                    "    c = 4 / 3 if setup.gradient_checkpointing else 1\n"
                    "    d = 0.0 if setup.offload_optimizer else 1.0\n"
                    "    return setup.autocast == 'fp8' or a or b or c or d\n")
    assert len(violations(fake, forbidden_fields())) == 5


def _plain() -> Setup:
    return Setup(device="cuda", task="train", autocast="bf16", optimizer="adamw_torch_fused", micro_batch_size=4, seq_len=512)


def test_a_technique_that_is_off_changes_no_term() -> None:
    """Every hook is called for every technique: the inactive ones must hand the terms back untouched."""
    spec, setup, hw = tiny_spec(), _plain(), hardware("a100")
    gpu_ = hw.smallest_gpu
    assert gpu_ is not None
    ctx = techniques.MemoryContext(spec, setup, setup, 1000, 2, 10_000, 80_000, 80_000)
    terms = techniques.MemoryTerms(activations=5000, extra_activations=0, logits=700, grads=20_000, step_temp=300,
                                   optimizer_on_device=80_000, cpu_ram=0)
    dev = PerDevice(weights=4000, grads=2000, optimizer=8000, buffers=100, cpu_ram=0)
    speed = techniques.SpeedContext(spec, setup, hw, gpu_, 2048, 312.0, 0.7, 1e14, 1.5e12, 2.5e10, lambda p, f, n: p * 1e12 * f)
    for t in techniques.registry():
        if t.active(setup):
            continue
        assert t.shape(setup) is setup, t.name
        assert t.memory(ctx, terms) == terms, t.name
        assert t.speed(speed) == techniques.StepSeconds(), t.name
        assert t.kernel_factors(setup) == techniques.KernelFactors(), t.name
        assert t.place(setup, dev) is dev, t.name


def test_padding_free_shapes_by_hand() -> None:
    """8 samples of 100 real tokens padded to 512: the Linears see 800 tokens, SDPA one row of 800, FA2 8 x 100."""
    base = _plain().replace(micro_batch_size=8, avg_seq_len=100)
    assert techniques.step_shape(base).matmul_tokens == 8 * 512
    assert techniques.step_shape(base).real_tokens == 800
    packed = base.replace(padding_free=True)
    assert techniques.step_shape(packed).matmul_tokens == 800
    assert techniques.step_shape(packed).attention == (1, 800)
    assert techniques.step_shape(packed.replace(attn_implementation="flash_attention_2")).attention == (8, 100)
    shaped = techniques.shaped(packed)
    assert (shaped.micro_batch_size, shaped.seq_len) == (1, 800)


def test_offloading_keeps_two_layers_and_liger_chunks_by_hand() -> None:
    # 10 layers' boundaries of 100 bytes each: the computing and the copying layer stay, 8 go to the host
    assert split_boundaries(1000, 10) == (200, 800)
    # Llama-2 head (V=32000, H=4096): ceil(V/H) = 8, 4096 tokens -> 512 rows, already a power of two
    spec = tiny_spec(vocab_size=32000, hidden_size=4096)
    assert chunk_rows(spec, 4096) == 512
    assert chunk_rows(spec, 4000) == 512     # ceil(4000/8) = 500 -> next power of two
    assert chunk_rows(spec, 4) == 1



def test_switches_are_constraints_and_off_changes_are_setup_fields() -> None:
    """The scenarios derive their constraint lists and the 'priced without it' Decisions from these declarations."""
    from perfguide.scenarios.applicable import TRAINING_ONLY
    from perfguide.scenarios.training import TECHNIQUE_CONSTRAINTS
    from perfguide.scenarios.types import Constraints

    switched = [t for t in techniques.registry() if t.switch]
    assert {t.switch for t in switched} >= {"liger_kernel", "optimizer_in_backward", "activation_offloading", "padding_free", "fp8"}
    for t in switched:
        assert t.switch in Constraints.model_fields, t.name
        assert t.switch in TECHNIQUE_CONSTRAINTS, t.name
        assert (t.switch in TRAINING_ONLY) == (t.requires.tasks == ("train",)), t.name
    for t in techniques.registry():
        assert set(t.off()) <= set(Setup.model_fields), t.name


def test_off_turns_the_technique_off() -> None:
    on = _plain().replace(liger_kernel=True, padding_free=True, avg_seq_len=100, activation_offloading=True)
    for name in ("liger_kernel", "padding_free", "activation_offloading"):
        t = techniques.get(name)
        assert t.active(on) and not t.active(on.replace(**t.off())), name


class _Probe(Technique):
    """A technique written the way the recipe says (one class, hooks only): 1 GiB beside the activations, 0.5 s
    more GPU time per micro-step, 2 s more per optimizer step."""

    name = "probe"

    def memory(self, ctx: techniques.MemoryContext, terms: techniques.MemoryTerms) -> techniques.MemoryTerms:
        return terms.changed("probe was here", extra_activations=terms.extra_activations + 2**30)

    def speed(self, ctx: techniques.SpeedContext) -> techniques.StepSeconds:
        return techniques.StepSeconds(compute=0.5, per_step=2.0)


def test_a_new_technique_reaches_the_cost_model_through_its_hooks_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    from test_speed import llama7b

    from perfguide.memory import estimate_memory
    from perfguide.speed import estimate_speed

    tiny, big, hw = tiny_spec(), llama7b(), hardware("a100")
    setup = _plain().replace(gradient_accumulation_steps=4)
    before_mem, before_speed = estimate_memory(tiny, setup, hw), estimate_speed(big, setup, hw)
    real = techniques.registry()
    monkeypatch.setattr(techniques, "registry", lambda: (*real, _Probe()))
    after_mem, after_speed = estimate_memory(tiny, setup, hw), estimate_speed(big, setup, hw)
    # the tiny model's peak is in forward, where the activations live: the probe's bytes land on it one for one
    assert after_mem.peak_allocated - before_mem.peak_allocated == 2**30
    assert "probe was here" in after_mem.notes
    # a 7B step is compute bound (not under the kernel-launch floor) on one GPU with nothing to overlap:
    # 4 micro-steps x 0.5 s + 2 s per step
    assert before_speed.bound == "compute"
    assert after_speed.step_time_s - before_speed.step_time_s == pytest.approx(4 * 0.5 + 2.0, rel=1e-9)


def test_cpu_offload_places_the_states_by_hand() -> None:
    """DeepSpeed offloads the optimizer (and, gathering at stage 3, the parameters); its reduced gradient partitions
    go to pinned host buffers for the CPU step; FSDP2's CPUOffloadPolicy moves all three. Host RAM is per node."""
    t = techniques.get("cpu_offload")
    dev = PerDevice(weights=4000, grads=2000, optimizer=8000, buffers=100, cpu_ram=0)
    base = _plain().replace(num_gpus=2, optimizer="adamw_torch")
    zero2 = t.place(base.replace(strategy="zero2", offload_optimizer=True), dev)
    assert (zero2.weights, zero2.grads, zero2.optimizer, zero2.buffers, zero2.cpu_ram) == (4000, 0, 0, 100, 2 * (2000 + 8000))
    zero3 = t.place(base.replace(strategy="zero3", offload_optimizer=True, offload_params=True), dev)
    assert (zero3.weights, zero3.grads, zero3.optimizer, zero3.cpu_ram) == (0, 0, 0, 2 * 14000)
    fsdp = t.place(base.replace(strategy="fsdp", offload_params=True), dev)
    assert (fsdp.weights, fsdp.grads, fsdp.optimizer, fsdp.cpu_ram) == (0, 0, 0, 2 * 14000)
    assert "parameters offloaded to CPU RAM" in fsdp.notes


def test_checkpointing_keeps_boundaries_and_one_block_by_hand() -> None:
    """The hook swaps all blocks' activations for their inputs, brings one block back for the recompute, and keeps
    autocast's 16-bit weight copies for that block only; speed/ is told of one recomputed forward."""
    spec, setup = tiny_spec(), _plain().replace(gradient_checkpointing=True)
    layers = spec.total_layers
    ctx = techniques.MemoryContext(spec, setup, setup, 1000, 2, 10_000, 80_000, 80_000, layer_activations=7000)
    terms = techniques.MemoryTerms(activations=7000 * layers, extra_activations=0, logits=700, grads=20_000, step_temp=300,
                                   optimizer_on_device=80_000, cpu_ram=0, weight_casts=600 * layers)
    out = techniques.get("gradient_checkpointing").memory(ctx, terms)
    assert (out.recompute, out.weight_casts) == (7000, 600)
    # each block keeps its input: b x s x hidden of the residual stream, fp32 under autocast with fp32 weights
    assert out.activations == layers * setup.micro_batch_size * setup.seq_len * spec.hidden_size * 4
    assert techniques.kernel_factors(setup).recompute == 1.0
    assert techniques.kernel_factors(_plain()).recompute == 0.0
