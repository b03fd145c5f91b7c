"""torch.compile's saved activations (techniques/torch_compile.py ``memory``) and torchtune's compiled chunked loss
(bench/accuracy_loss.py), against hand-derived bytes and real CPU tensors: Inductor's min-cut partition of a Llama
block saves each RMSNorm's 16-bit input and one fp32 rstd per row where eager autograd keeps the fp32 upcast and the
normalised copy, and recomputes SiLU(gate): 8 B per hidden unit and 2 B per FFN unit per token less in a bf16 block
(scripts/trace_compiled_block.py, data/techniques.json ``compiled_blocks``)."""

from __future__ import annotations

import pytest
from helpers import load_bench, load_script

from perfguide import Hardware, LoraSpec, ModelSpec, Setup
from perfguide.data.techniques import compiled_blocks
from perfguide.memory import estimate_memory

H, I, HEADS, KV, D, LAYERS = 3072, 8192, 24, 8, 128, 28   # Llama-3.2-3B (its config.json)
TOKENS = 2 * 4096


def _hand_saving(h: int, i: int) -> int:
    """Per token per block, bf16: two norms x (fp32 upcast 4 B + normalised bf16 copy 2 B - the bf16 input Inductor
    saves instead, 2 B) per hidden unit, and SiLU(gate)'s 2 B per FFN unit."""
    return 2 * (4 + 2 - 2) * h + 2 * i


def test_traced_counts_are_the_hand_derived_tensors() -> None:
    blocks = compiled_blocks().blocks
    hf, tt = blocks["transformers:llama"], blocks["torchtune:llama"]
    assert (hf.hidden_size, hf.intermediate_size) == (H, I)
    assert hf.eager_bytes_per_token - hf.compiled_bytes_per_token == _hand_saving(H, I) == 40960
    # torchtune's block: k and v expanded to every query head (a copy the attention saves), and the rotary cache
    # gathered at input_pos, fp32 [head_dim / 2, 2] per token: twice eager (q's and k's calls), once compiled
    expanded = 2 * (HEADS - KV) * D * 2
    assert tt.eager_bytes_per_token - hf.eager_bytes_per_token == expanded + 2 * 4 * D
    assert tt.compiled_bytes_per_token - hf.compiled_bytes_per_token == expanded + 4 * D


@pytest.fixture(scope="module")
def llama() -> ModelSpec:
    return ModelSpec.from_any("meta-llama/Llama-3.2-3B")


def _est(spec: ModelSpec, **kw: object):
    base = dict(task="train", device="cuda", micro_batch_size=2, seq_len=4096, weights_dtype="bf16",
                optimizer="adamw_torch_fused")
    return estimate_memory(spec, Setup(**{**base, **kw}), Hardware.from_name("a100-80gb"))


def test_compile_prices_the_traced_saving(llama: ModelSpec) -> None:
    assert (llama.hidden_size, llama.intermediate_size, llama.total_layers) == (H, I, LAYERS)
    eager, compiled = _est(llama), _est(llama, torch_compile=True)
    assert eager.activations - compiled.activations == _hand_saving(H, I) * TOKENS * LAYERS
    # checkpointed: the blocks keep their inputs either way; the one recomputed in backward keeps less
    eager, compiled = _est(llama, gradient_checkpointing=True), _est(llama, gradient_checkpointing=True, torch_compile=True)
    assert eager.activations - compiled.activations == _hand_saving(H, I) * TOKENS


@pytest.mark.parametrize("kw", [dict(lora=LoraSpec(r=16, use_dora=True)), dict(weights_dtype="fp32", autocast="bf16"),
                                dict(liger_kernel=True)])
def test_compile_changes_nothing_untraced_or_already_fused(llama: ModelSpec, kw: dict[str, object]) -> None:
    """DoRA and autocast were not traced compiled (PEFT LoRA was: tests/test_compiled_lora.py); Liger's kernels
    already keep only what Inductor keeps."""
    assert _est(llama, **kw).activations == _est(llama, torch_compile=True, **kw).activations


def test_small_block_traced_saving_is_the_hand_count() -> None:
    """The script's counters on a small Llama block (real CPU tensors, Inductor compiling it twice): the eager and
    compiled bytes per token differ by the hand count; torchtune's eager block by its expanded k / v and rotary."""
    pytest.importorskip("torch")
    trace = load_script("trace_compiled_block")
    dims = {"h": 256, "heads": 4, "kv": 2, "d": 64, "i": 512}
    eager, compiled = trace.per_token("transformers", False, dims), trace.per_token("transformers", True, dims)
    assert eager - compiled == _hand_saving(256, 512)
    torchtune = trace.per_token("torchtune", False, dims)
    assert torchtune - eager == 2 * (4 - 2) * 64 * 2 + 2 * 4 * 64


def test_compiled_chunk_cross_entropy_keeps_and_writes_one_16bit_chunk() -> None:
    """torchtune's compiled ``compute_cross_entropy`` (``F.cross_entropy(logits.float(), ...)``, sum): the graph
    saves the 16-bit chunk itself and per-row statistics, and its backward allocates one [rows, V] buffer, 16-bit
    (the chunk's gradient): no fp32 upcast, softmax or fp32 gradient of the chunk is ever materialised."""
    torch = pytest.importorskip("torch")
    import torch.nn.functional as F
    from torch._inductor.utils import run_and_get_code

    rows, vocab = 256, 4096

    def cce(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.float(), labels, reduction="sum", ignore_index=-100)

    torch._dynamo.reset()
    with torch._inductor.config.patch(force_disable_caches=True):   # a cached graph would skip the code generation
        compiled = torch.compile(cce, dynamic=False)
        chunk = torch.randn(rows, vocab, dtype=torch.bfloat16, requires_grad=True) * 1.0
        labels = torch.randint(0, vocab, (rows,))
        loss = compiled(chunk, labels)
        node = loss.grad_fn
        while "CompiledFunction" not in type(node).__name__:
            node = node.next_functions[0][0]
        big = [t for t in node.saved_tensors if t.numel() >= rows * vocab]
        assert len(big) == 1 and big[0].untyped_storage().data_ptr() == chunk.untyped_storage().data_ptr()
        assert sum(t.untyped_storage().nbytes() for t in node.saved_tensors if t.numel() < rows * vocab) <= rows * 16
        _, codes = run_and_get_code(loss.backward)
    allocs = [line for code in codes for line in code.splitlines() if f"(({rows}, {vocab})" in line and "empty_strided" in line]
    assert len(allocs) == 1 and "torch.bfloat16" in allocs[0], allocs


def test_torchtune_block_code_bytes_hand_derived() -> None:
    """bench: torchtune's packed Llama-3.2-3B rows without checkpointing keep the expanded k / v and the gathered
    rotary cache beside transformers' table; a checkpointed row keeps one recomputed block's worth (left out)."""
    acc = load_bench("accuracy")
    rows = {r["row_id"]: r for r in acc.csv.DictReader(acc.CSV.open(encoding="utf-8"))}
    expanded = 2 * (HEADS - KV) * D * 2
    for row_id, rope in (("2075", 2 * 4 * D), ("2076", 4 * D), ("2078", None)):
        row = rows[row_id]
        spec = acc._spec(row["model_hf_id"])
        setup = acc._train_setup(row, spec)
        want = 0 if rope is None else (expanded + rope) * TOKENS * LAYERS
        assert acc._block_code_bytes(row, spec, setup) == want, row_id


# --- torchtune's adapters: made in the run dtype ------------------------------------------------------------------------

#: Llama-3.2-3B, rank 64 on q, v, o and the MLP (torchtune's 3B QLoRA config): per block q 3072x3072, v 3072x1024,
#: o 3072x3072, gate / up 3072x8192, down 8192x3072, each adapter r x (in + out)
ADAPTER_PARAMS = LAYERS * 64 * ((3072 + 3072) + (3072 + 1024) + (3072 + 3072) + 2 * (3072 + 8192) + (8192 + 3072))


@pytest.mark.parametrize("dtype, width", [(None, 4), ("bf16", 2), ("fp32", 4)])
def test_adapter_dtype_prices_the_adapters_in_it(llama: ModelSpec, dtype: str | None, width: int) -> None:
    """On an NF4 base PEFT's adapters are fp32; torchtune's are the run dtype: the parameter, gradient and both
    AdamW moments take its bytes."""
    assert ADAPTER_PARAMS == 89_915_392
    targets = ("q_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    lora = LoraSpec(r=64, alpha=128, target_modules=targets, autocast_adapter_dtype=False, adapter_dtype=dtype)
    est = _est(llama, weights_dtype="nf4", lora=lora, gradient_checkpointing=True, kbit_upcast=False)
    assert est.gradients == ADAPTER_PARAMS * width
    assert est.optimizer_states == 2 * ADAPTER_PARAMS * width


def test_prepare_casts_the_adapters_it_priced() -> None:
    """``prepare_model`` leaves the adapters in ``adapter_dtype`` (PEFT makes them fp32 on this bf16 base with its
    upcast), the base Linears untouched."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("peft")
    from helpers import tiny_model
    from peft import LoraConfig, get_peft_model

    from perfguide.integrations.prepare import cast_adapters

    model = get_peft_model(tiny_model().to(torch.bfloat16), LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    assert {p.dtype for n, p in model.named_parameters() if "lora_" in n} == {torch.float32}
    cast_adapters(model, "bf16")
    assert {p.dtype for n, p in model.named_parameters() if "lora_" in n} == {torch.bfloat16}
    assert {p.dtype for n, p in model.named_parameters() if "lora_" not in n} == {torch.bfloat16}
