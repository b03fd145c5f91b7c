"""The activations a LoRA / DoRA adapter adds to a block: what each adapted Linear's branch saves for backward on top
of the frozen block (activations.layer_bytes prices the block with its Linears frozen). PEFT's own tensors, by the
adapters' dtype, autocast, dropout and DoRA's magnitude rescaling; traced in scripts/trace_block_backward.py and
tests/test_dora_activations.py."""

from __future__ import annotations

from functools import lru_cache

from .._packages import installed_release
from ..setup import Setup
from .activations import engine_casts_to_16bit
from .loss_path import version_tuple

#: the first peft release whose DoRA forward reuses the base layer's output when the adapter's dropout is the identity
#: (huggingface/peft#2122, "Optimize DoRA in eval and no dropout"; DoraLinearLayer.forward(base_result=...)); 0.9.0
#: to 0.13.x run ``F.linear(x, W)`` again in every DoRA forward, dropout or not
DORA_REUSES_BASE = (0, 14)
#: the first peft release that builds DoRA's delta weight through the modules on an in x in identity
#: (``lora_B(lora_A(torch.eye(in))).T``, so FSDP's hooks run: huggingface/peft#1806, "Refactor to make DoRA and QDoRA
#: work with FSDP"); 0.9.0 to 0.11.x multiplied the weights (``lora_B.weight @ lora_A.weight``): no identity
DORA_IDENTITY = (0, 12)


@lru_cache(maxsize=1)
def installed_peft() -> str | None:
    """The peft release installed next to perfguide (the one a plan made here trains with); None if absent."""
    return installed_release("peft")


def _peft_before(release: tuple[int, int]) -> bool:
    """The installed peft is older than ``release``; none installed: the newest behaviour."""
    installed = installed_peft()
    return installed is not None and version_tuple(installed)[:2] < release


def dora_identity(setup: Setup) -> bool:
    """Whether DoRA's delta weight runs through the modules on an identity (peft >= 0.12, ``DORA_IDENTITY``)."""
    return setup.lora is not None and setup.lora.use_dora and not _peft_before(DORA_IDENTITY)


def dora_reruns_base(setup: Setup) -> bool:
    """Whether each DoRA Linear runs its base matmul a second time, on the adapter's input: with ``lora_dropout`` > 0
    the dropped input cannot reuse the base layer's output (peft DoraLinearVariant.forward: ``x = dropout(x);
    base_result = None``), and peft before 0.14 re-ran it always. The installed release decides; none installed: the
    newest behaviour."""
    if setup.lora is None or not setup.lora.use_dora:
        return False
    return setup.lora.dropout > 0 or _peft_before(DORA_REUSES_BASE)


def lora_layer_bytes(setup: Setup, lora_inputs_per_layer: int, lora_rank_total: int, dora_outputs_per_layer: int = 0,
                     dora_weights_per_layer: int = 0, *, padded_outputs_per_layer: int = 0,
                     shared_inputs_per_layer: int = 0, attention_output_inputs_per_layer: int = 0,
                     base_keeps_inputs: bool = False) -> int:
    """Adapter tensors per block: the input each adapted Linear's ``lora_A`` keeps, plus its r-wide output.

    PEFT keeps adapters fp32 and casts a 16-bit input to fp32 before ``lora_A`` (``_cast_input_dtype``), so
    on a 16-bit base each adapted Linear keeps a 4-byte copy of its input; under autocast lora_A keeps its
    own 16-bit cast, on fp32 weights and on a 16-bit or k-bit base alike; in fp32 the (shared) input itself, counted per target (a small overcount). With
    ``lora_dropout`` > 0 the dropout (peft ``lora_A(dropout(x))``) also keeps its mask: one byte per input element
    (native_dropout's bool mask, ATen Dropout.cpp), and lora_A keeps the dropped copy instead of the input.
    litgpt (``model_code``) creates its adapters in the run's 16-bit dtype, so lora_A keeps the 16-bit input (or its
    dropped copy); its q/k/v share one input (ledger._lora_inputs) and a partly enabled fused qkv keeps its lora_B
    output (``padded_outputs_per_layer``, ledger._padded_outputs).

    DoRA (``dora_outputs_per_layer``: the adapted Linears' output widths) rescales both branches by the trainable
    magnitude (peft ``DoraLinearLayer.forward``: ``(m / ||W + sBA|| - 1) * base_result + m / ||.|| * lora_result *
    s``), and each product saves its full-width operand for the magnitude's gradient: the base layer's output (its
    compute dtype) and the adapter output (the adapters' compute dtype). Where the base matmul runs again
    (``dora_reruns_base``) its output is in the adapter input's dtype, and ``F.linear`` keeps the weight it ran with
    for the input's gradient: ``weight.to(x.dtype)``, a new tensor of ``dora_weights_per_layer`` elements
    (``dora_weight_copy_bytes``); counted in every block, though the first block's attention targets keep none where
    the embeddings' output needs no gradient (no checkpointing's enable_input_require_grads). Traced on real CPU
    tensors, peft 0.21 (tests/test_dora_activations.py).

    16-bit adapters on a 16-bit base without dropout or autocast take the block's tensor itself (``_cast_input_dtype``
    returns it): q / k / v, and gate / up, keep one storage between them (``shared_inputs_per_layer``,
    ledger._shared_inputs, counted once), and o_proj's is the attention's saved output, already counted in the block
    (``attention_output_inputs_per_layer``, ledger._attention_output_inputs). Traced, scripts/trace_compiled_block.py
    (transformers' LlamaDecoderLayer at Llama-3.2-3B's widths, peft 0.21, real CPU tensors): bf16 adapters on every
    Linear keep 2 B per element of q's and gate's inputs and down_proj's, nothing for k, v, up or o; fp32 adapters
    one fp32 copy per adapted Linear (each ``x.to(float32)`` a new tensor), as counted here. Where every frozen base
    Linear keeps its input (``base_keeps_inputs``: FSDP1's shared FlatParameter, analytic.frozen_params_get_grads),
    such an adapter's input is that same tensor: none of it counted again.
    """
    if not lora_inputs_per_layer:
        return 0
    autocast_runs, nbytes = _adapter_input(setup)
    mask = 1 if setup.lora is not None and setup.lora.dropout > 0 else 0
    tokens = setup.micro_batch_size * setup.seq_len
    reruns = dora_reruns_base(setup)
    dora = dora_outputs_per_layer * (nbytes + (nbytes if reruns else _base_output_bytes(setup, autocast_runs)))
    copies = dora_weights_per_layer * dora_weight_copy_bytes(setup) if reruns else 0
    # litgpt's partly enabled LoRAQKVLinear keeps its lora_B output (ledger._padded_outputs), in the adapters' dtype
    padded = padded_outputs_per_layer * nbytes
    # an adapter taking the block's own tensor keeps nothing of its own where that tensor is kept already
    kept_elsewhere = lora_inputs_per_layer if base_keeps_inputs else shared_inputs_per_layer + attention_output_inputs_per_layer
    inputs = lora_inputs_per_layer - (kept_elsewhere if input_is_shared(setup) else 0)
    return int(tokens * (inputs * nbytes + lora_rank_total * nbytes + lora_inputs_per_layer * mask + dora + padded)) + copies


def input_is_shared(setup: Setup) -> bool:
    """Whether each adapted Linear's ``lora_A`` keeps the block's own tensor, uncast and undropped, so Linears that read
    one tensor keep one storage: 16-bit adapters in a 16-bit base's dtype, no autocast, no dropout, plain LoRA (the
    traced case; fp32 adapters on fp32 weights would share too, not traced here)."""
    lora = setup.lora
    if lora is None or lora.dropout > 0 or lora.use_dora or setup.weights_dtype not in ("bf16", "fp16"):
        return False
    autocast_runs, nbytes = _adapter_input(setup)
    return not autocast_runs and nbytes == 2 and (lora.adapter_dtype is None or lora.adapter_dtype == setup.weights_dtype)


def dora_weight_copy_bytes(setup: Setup) -> int:
    """Bytes per base-weight element the re-run DoRA matmul keeps for backward beyond the weight itself: peft passes
    ``dequantize_module_weight(base).to(x.dtype)``, with ``x`` in the adapters' dtype. Under autocast ``F.linear``
    keeps autocast's 16-bit cast of it, a new tensor unless it was 16-bit already (16-bit adapters on a 16-bit base);
    without autocast the copy itself, unless the adapters share the base weight's dtype (then ``.to`` returns the
    weight). A k-bit base is dequantized into a new tensor every forward, so it always keeps one."""
    autocast_runs, _ = _adapter_input(setup)
    adapters = adapter_dtype_bytes(setup)
    if setup.weights_dtype not in ("fp32", "bf16", "fp16"):   # k-bit
        return 2 if autocast_runs else adapters
    weight = 4 if setup.weights_dtype == "fp32" else 2
    if autocast_runs:   # autocast's cast returns the tensor itself only when it is already in autocast's dtype
        return 0 if adapters == weight == 2 and setup.weights_dtype == setup.autocast else 2
    return 0 if adapters == weight else adapters


def dora_norm_bytes(setup: Setup, largest: tuple[int, int]) -> int:
    """The weight norm's transient in one DoRA Linear's forward (peft ``DoraLinearLayer.forward``), for the Linear
    ``largest`` = (in, out): alive together while ``||W + s BA||`` is taken are the in x in identity ``lora_A`` keeps
    for its weight gradient while the delta ``lora_B(lora_A(eye)).T`` lives (the adapters' dtype; under autocast its
    16-bit cast, the identity itself then freed), and, in the adapters' dtype, the delta, the weight cast to it (where
    the dtypes differ; a k-bit base dequantized to 16 bits first), ``s * delta`` and the sum; all freed before the next
    Linear; before peft 0.12 no identity (``DORA_IDENTITY``). Traced on a DoRA Linear's forward on CPU tensors, peft
    0.21 (tests/test_dora_activations.py)."""
    fan_in, fan_out = largest
    if not fan_in:
        return 0
    a = adapter_dtype_bytes(setup)
    kbit = setup.weights_dtype not in ("fp32", "bf16", "fp16")
    weight = 4 if setup.weights_dtype == "fp32" else 2
    cast = (2 + a) if kbit else (a if weight != a else 0)
    identity = 2 if setup.autocast is not None and not engine_casts_to_16bit(setup) else a
    identity = identity if dora_identity(setup) else 0   # before peft 0.12: lora_B.weight @ lora_A.weight
    return fan_in * fan_in * identity + fan_in * fan_out * (3 * a + cast)


def _adapter_input(setup: Setup) -> tuple[bool, int]:
    """(autocast runs, bytes per element of the input the adapters compute on)."""
    # under autocast (fp32 weights or a 16-bit / k-bit base alike) lora_A's matmul keeps autocast's 16-bit cast of its
    # input; the fp32 copy peft makes first is freed (traced, scripts/trace_block_backward.py: 2 B per input element)
    autocast_runs = setup.autocast is not None and not engine_casts_to_16bit(setup)
    return autocast_runs, 2 if autocast_runs or _sixteen_bit_adapters(setup) else 4   # 16-bit adapters: 16-bit inputs


def adapter_dtype_bytes(setup: Setup) -> int:
    """Bytes per element of the adapters' weights, the dtype peft casts a Linear's input to before the adapter runs."""
    return 2 if _sixteen_bit_adapters(setup) else 4


def _sixteen_bit_adapters(setup: Setup) -> bool:
    """Adapters kept in 16 bits: TRL 0.7.5-0.8.6's recast on a k-bit base, no upcast on a 16-bit base (peft < 0.12),
    or litgpt's, created in the run's 16-bit dtype (ledger.adapter_bytes), or a stack's own named 16-bit adapters
    (``LoraSpec.adapter_dtype``: torchtune's)."""
    if setup.lora is not None and setup.lora.adapter_dtype is not None:
        return setup.lora.adapter_dtype in ("bf16", "fp16")
    litgpt = setup.model_code == "litgpt" and setup.autocast is None and setup.compute_dtype in ("bf16", "fp16")
    return litgpt or setup.kbit_recast_adapters or (setup.lora is not None and not setup.lora.autocast_adapter_dtype
                                                    and setup.weights_dtype in ("bf16", "fp16"))


def _base_output_bytes(setup: Setup, autocast_runs: bool) -> int:
    """Bytes per element of a frozen base Linear's output: 16-bit under autocast, on a 16-bit base and from a k-bit
    base's 16-bit compute; fp32 weights without autocast give fp32."""
    return 2 if autocast_runs or setup.weights_dtype != "fp32" else 4
