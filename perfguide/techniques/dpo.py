"""DPO (TRL ``DPOTrainer``, Direct Preference Optimization): what a preference step costs beyond an SFT step.

Read in trl 1.16 (trainer/dpo_trainer.py, trainer/utils.py, kernels/chunked_logprob.py, models/utils.py):

* the collator puts the chosen and the rejected completion of every prompt in one batch (``torch.cat`` of
  ``[chosen, rejected]``, padded to the longer one, prompt + completion cut at ``max_length``), so a micro-batch of
  ``b`` pairs is one forward over ``2 b`` sequences (``shape`` / ``step_shape``: the batch doubled);
* the policy's log-probs come from a fused LM head (``add_fused_lm_head``, ``fused_lm_head=True``): the full
  ``[2b, s, V]`` logits are never built. ``ChunkedLogProbFunction`` saves the label positions' hidden states,
  projects them in ``[4096, 32768]`` tiles into one tile buffer, keeps a dozen fp32 numbers per position, and in
  backward recomputes every tile (one more head GEMM) and accumulates the input and (trained head) weight
  gradients in fp32;
* the reference: full fine-tuning loads a second, frozen copy in the policy's dtype (``create_model_from_path``
  with ``dtype=self.model.dtype``, TRL 1.16; 1.0-1.15 pass no dtype, so a model object without a ``ref_model`` or a
  ``model_init_kwargs`` dtype gets the function's float32 default: the plan's DPOConfig names the policy's dtype in
  ``model_init_kwargs``, ``reference_init_kwargs``; TRL v1.15's own DPO rows ran a bf16 reference,
  docs/validation.md 33), placed by ``accelerator.prepare_model(evaluation_mode=True)`` on one GPU / DDP,
  by a ZeRO stage-0 DeepSpeed engine under ZeRO-1/2 (a whole copy per GPU, cast to 16 bit by the engine's bf16/fp16
  mode), sharded under ZeRO-3 (its offload_param kept) and under FSDP (``prepare_fsdp``: ``fully_shard`` with the
  plugin's reshard and offload policy). With a PEFT model there is no copy: the reference forward runs the policy
  with its adapters disabled. ``precompute_ref_log_probs`` computes them once before training, after which no
  reference is kept (under FSDP one is loaded for the precompute and dropped);
* the reference forward runs under ``torch.no_grad()`` after the policy's forward, while the policy's saved
  activations are held: it keeps nothing, its peak is one layer's buffers (or its own fused head) at a time.

Priced here: the reference copy's bytes per device (``place``), activations on ``2 b`` sequences, the fused head's
buffers and the reference forward's transient in place of HF's full-logits loss path (``memory``), and in speed a
second forward of the blocks (``kernel_factors.recompute``), the two extra head GEMMs and, where the reference is
sharded, its all-gather (``speed``). Every
position after the first is counted as a completion token (an upper bound: prompt positions carry no label).
With TRL 1.0-1.14 installed (data/trl.json eras) DPOTrainer builds the full ``[2b, s, V]`` logits of the policy and
the reference instead of the fused head's buffers: memory/dpo_logits.py prices them, and the head runs no recompute.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..data.techniques import constant
from ..errors import InvalidSetupError
from ..memory import fused_head
from ..memory.dpo_logits import dpo_logits_bytes, path_kind
from ..memory.fused_head import TrlEra, fused_head_parts, hidden_bytes, sft_positions, trl_era
from ..memory.inference import prefill_transient_bytes
from ..memory.loss_path import installed_transformers, version_tuple
from ..memory.masks import no_grad_forward_mask_bytes
from ..memory.softcap import final_softcap_bytes
from ..setup import DTYPE_BYTES
from ..speed.rates import half_bytes, ring_time
from .base import EmitContext, Requires, Technique
from .effects import KernelFactors, MemoryContext, MemoryTerms, SpeedContext, StepSeconds, StepShape

if TYPE_CHECKING:
    from ..hardware.types import GPU, Hardware
    from ..model.types import ModelSpec
    from ..setup import Setup

SOURCES = (
    "Rafailov et al. 2023, Direct Preference Optimization (arXiv:2305.18290)",
    "https://huggingface.co/docs/trl/dpo_trainer",
    "https://github.com/huggingface/trl/blob/main/trl/trainer/dpo_trainer.py (reference model, _compute_loss)",
    "https://github.com/huggingface/trl/blob/main/trl/kernels/chunked_logprob.py (fused LM head)",
    "https://github.com/huggingface/trl/blob/main/trl/models/utils.py (prepare_deepspeed, prepare_fsdp)",
)


class Dpo(Technique):
    name = "dpo"
    fields = ("objective", "precompute_ref_log_probs")
    summary = "DPO: chosen and rejected completions in one forward, plus a frozen reference model's forward"
    sources = SOURCES
    requires = Requires(tasks=("train",), binding=True)
    order = 36
    label_order = 66
    switch = "objective"

    def active(self, setup: Any) -> bool:
        return bool(setup.objective == "dpo")

    def implied(self, fields: dict[str, Any]) -> dict[str, Any]:
        # DPO only runs in TRL's DPOTrainer: a DPO Setup that names no trainer is a TRL one
        return {"trainer": "trl"} if fields.get("objective") == "dpo" and "trainer" not in fields else {}

    def conflict(self, setup: Any) -> str | None:
        if self.active(setup) and setup.trainer != "trl":
            return "objective='dpo' runs in TRL's DPOTrainer, not the transformers Trainer; set trainer='trl' (or leave it out)"
        if setup.precompute_ref_log_probs and not self.active(setup):
            return "precompute_ref_log_probs is a DPO setting; set objective='dpo', or precompute_ref_log_probs=False"
        if self.active(setup) and setup.padding_free:
            return self._refused("TRL 1.16's DPOTrainer ignores padding_free (it warns and pads: 'temporarily unavailable "
                                 "after a refactor'), so a padding-free DPO step cannot be run; set padding_free=False")
        if self.active(setup) and setup.liger_kernel:
            return self._refused("TRL 1.16's DPOTrainer computes log-probs with its own fused LM head and refuses Liger's fused "
                                 "linear cross-entropy, which perfguide's Liger prices; set liger_kernel=False")
        return super().conflict(setup)

    def label_word(self, setup: Any) -> str | None:
        if not self.active(setup):
            return None
        return "dpo-precomputed-ref" if setup.precompute_ref_log_probs else "dpo"

    def off(self) -> dict[str, Any]:
        return {}   # the objective is the user's, not a trade the plan makes: nothing to price it against

    # --- adapters ------------------------------------------------------------------------------------
    def trl_args(self, ctx: EmitContext) -> dict[str, Any]:
        # DPOConfig only (integrations/trl_dpo.py); an SFT plan emits nothing, so SFTConfig never sees the key
        if not self.active(ctx.setup):
            return {}
        return {"precompute_ref_log_probs": bool(ctx.setup.precompute_ref_log_probs),
                **reference_init_kwargs(ctx.setup, fused_head.installed_trl())}

    # --- the cost model ------------------------------------------------------------------------------
    def shape(self, setup: Any) -> Any:
        if not self.active(setup):
            return setup
        return setup.model_copy(update={"micro_batch_size": 2 * setup.micro_batch_size, "objective": "sft",
                                        "precompute_ref_log_probs": False})

    def step_shape(self, setup: Any, shape: StepShape) -> StepShape:
        if not self.active(setup):
            return shape
        b, s = shape.attention
        return StepShape(2 * shape.matmul_tokens, (2 * b, s), 2 * shape.real_tokens)

    def memory(self, ctx: MemoryContext, terms: MemoryTerms) -> MemoryTerms:
        if not self.active(ctx.setup):
            return terms
        check_causal_lm(ctx.spec)
        on_device, host = reference_weight_bytes(ctx.spec, ctx.setup)
        release = fused_head.installed_trl()
        terms = terms.changed(reference_note(ctx.setup, on_device, host) + fp32_reference_warning(ctx.setup, release),
                              extra_weights=terms.extra_weights + on_device, cpu_ram=terms.cpu_ram + host)
        era = trl_era(release)
        if era.dpo_loss in ("torch", "kernel"):   # TRL 1.0-1.14: full [2b, s, V] logits, policy and reference
            path = full_logits_path_bytes(ctx.spec, ctx.setup, era)
            kind = "Triton log-prob kernel" if path_kind(era, ctx.setup) == "kernel" else "torch selective_log_softmax"
            return terms.changed(f"DPO loss path: TRL {release}'s full [2b, s, V] logits ({kind}), {path / 1e9:.2f} GB at its "
                                 "peak; TRL >= 1.15 scores with a fused LM head and keeps far less", logits=path)
        path = loss_path_bytes(ctx.spec, ctx.setup, ctx.grad_elem_bytes)
        return terms.changed(f"DPO loss path: TRL's fused LM head on {label_positions(ctx.setup)} label positions "
                             f"({path / 1e9:.2f} GB at its peak) instead of [2b, s, V] logits{older_trl_warning()}", logits=path,
                             head_cast_saved=False)   # ChunkedLogProbFunction saves the fp32 head, casting per tile

    def kernel_factors(self, setup: Any) -> KernelFactors:
        return KernelFactors(recompute=1.0) if runs_reference_forward(setup) else KernelFactors()

    def speed(self, ctx: SpeedContext) -> StepSeconds:
        if not self.active(ctx.setup):
            return StepSeconds()
        return StepSeconds(compute=extra_head_flops(ctx.spec, ctx.setup) / ctx.rate,
                           comm=reference_gather_seconds(ctx.spec, ctx.setup, ctx.hardware, ctx.gpu))


def older_trl_warning() -> str:
    """TRL 0.x's DPOTrainer (concatenated_forward, its reference pass first) is not priced (data/trl.json eras): the
    plan is priced as TRL >= 1.15 and says so rather than pricing it silently."""
    release = fused_head.installed_trl()
    if trl_era(release).dpo_loss != "unpriced":
        return ""
    return f" (priced for TRL >= 1.15; the installed TRL {release} builds the full logits: upgrade TRL to train this plan)"


def reference_gather_seconds(spec: ModelSpec, setup: Setup, hardware: Hardware, gpu: GPU) -> float:
    """The sharded reference's all-gather per micro-step: ZeRO-3 and FSDP FULL_SHARD gather its weights layer by
    layer for the forward and free them after, as they do the policy's (speed/training.py prices those); HSDP
    gathers inside the node. SHARD_GRAD_OP never reshards a model that runs no backward, so it gathers once."""
    if not (keeps_reference_copy(setup) and setup.gathers_params):
        return 0.0
    layout = setup.model_copy(update={"nodes": 1}) if setup.hybrid_shard else setup
    return ring_time(spec.total_params * half_bytes(setup), layout, hardware, gpu, 1)


# --- what the step holds, priced on the Setup ------------------------------------------------------------

def check_causal_lm(spec: ModelSpec) -> None:
    """TRL 1.16's DPOTrainer loads an AutoModelForCausalLM and patches its LM head (add_fused_lm_head): a decoder LM
    only. Anything else is refused in one line rather than priced as a step that cannot run."""
    if spec.is_encoder_decoder or not spec.generates:
        kind = ("an encoder-decoder" if spec.is_encoder_decoder else "an encoder (masked LM)" if spec.head == "lm"
                else f"a {spec.head} head")
        raise InvalidSetupError(f"objective='dpo' trains a decoder-only causal LM (TRL's DPOTrainer); {spec.name} has {kind}; "
                                "use objective='sft', or a causal LM")


def runs_reference_forward(setup: Setup) -> bool:
    """Every DPO micro-step runs the reference forward unless its log-probs were precomputed."""
    return setup.objective == "dpo" and not setup.precompute_ref_log_probs


def keeps_reference_copy(setup: Setup) -> bool:
    """Full fine-tuning keeps a second frozen model through training; LoRA disables its adapters instead, and a
    precomputed reference is dropped once computed (dpo_trainer.py: ``self.ref_model = None``)."""
    return runs_reference_forward(setup) and setup.lora is None


def label_positions(setup: Setup) -> int:
    """Positions the fused head scores per micro-step: every next-token label of the 2 b sequences (an upper bound:
    prompt positions carry label -100 and are skipped on CUDA): an SFT step's positions, over two rows per pair."""
    return 2 * sft_positions(setup)


#: ``from_pretrained`` dtype names of the weight dtypes a full fine-tune's reference copy is priced at
TRL_DTYPE_NAMES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def reference_init_kwargs(setup: Setup, release: str | None) -> dict[str, Any]:
    """``model_init_kwargs`` naming the policy's dtype, so the reference TRL ``release`` loads is the copy the plan
    priced (None: TRL not installed here, the target's release unknown).

    DPOTrainer builds the reference with ``create_model_from_path(ref_model_path, **args.model_init_kwargs)``, whose
    dtype defaults to float32 (trl/trainer/utils.py, 1.0.0-1.16.0). TRL 1.16 first sets the policy's dtype
    (``ref_model_init_kwargs.setdefault("dtype", self.model.dtype)``); 1.0-1.15 do not, so a bf16 model object without
    a ``ref_model`` gets an fp32 reference, twice the bytes priced (read in the 1.0.0, 1.8.0, 1.13.0, 1.14.2 and
    1.15.0 wheels). Naming the dtype fixes it in every 1.x release (a model given as a string loads at it too, as the
    plan priced the policy); it is left out under 1.16+, where it changes nothing and a model object makes TRL warn
    that ``model_init_kwargs`` are ignored. Nothing when no reference copy is kept (LoRA, precomputed log-probs)."""
    name = TRL_DTYPE_NAMES.get(setup.weights_dtype)
    newer = release is not None and version_tuple(release) >= (1, 16)
    return {"model_init_kwargs": {"dtype": name}} if keeps_reference_copy(setup) and name and not newer else {}


def fp32_reference_warning(setup: Setup, release: str | None) -> str:
    """Said where the installed TRL (1.0-1.15) would load an fp32 reference beside a 16-bit policy object unless
    the config names the dtype (``reference_init_kwargs``), which a DPOConfig of the user's own may not."""
    if not (keeps_reference_copy(setup) and release and version_tuple(release) < (1, 16)) or setup.weights_dtype == "fp32":
        return ""
    return (f"; TRL {release} loads it in float32 unless DPOConfig.model_init_kwargs names a dtype (rec.dpo_config() sets "
            f"{reference_init_kwargs(setup, release)['model_init_kwargs']}; TRL's warning that they are ignored concerns "
            "the policy object only), or pass ref_model")


def reference_weight_bytes(spec: ModelSpec, setup: Setup) -> tuple[int, int]:
    """(bytes on each GPU, host RAM per node) of the reference copy, placed as trl 1.16 prepares it (module
    docstring). Loaded in the policy's dtype; DeepSpeed's bf16/fp16 mode casts it to 16 bit; ZeRO-3 and FSDP shard
    it like the policy (offloaded with it), FSDP SHARD_GRAD_OP keeps the gathered 16-bit copy after its forward (no
    backward ever reshards it)."""
    if not keeps_reference_copy(setup):
        return 0, 0
    params = spec.total_params
    stored = DTYPE_BYTES[setup.weights_dtype]
    half = 2 if setup.autocast in ("bf16", "fp16", "fp8") else stored
    if setup.is_deepspeed:
        if setup.strategy != "zero3":
            return int(params * half), 0
        shard = int(params * half) // setup.world_size
        return (0, shard * setup.num_gpus) if setup.offload_params else (shard, 0)
    if setup.is_fsdp:
        shard = int(params * stored) // setup.shard_degree
        at_rest = (0, shard * setup.num_gpus) if setup.offload_params else (shard, 0)
        gathered = int(params * half) if not setup.gathers_params else 0
        return at_rest[0] + gathered, at_rest[1]
    return int(params * stored), 0


def reference_note(setup: Setup, on_device: int, host: int) -> str:
    """What the report says about the reference model."""
    if setup.precompute_ref_log_probs:
        return "DPO reference: log-probs precomputed before training; no reference model or reference forward in the step"
    if setup.lora is not None:
        return "DPO reference: the policy with its adapters disabled (no second copy); one no-grad forward per micro-step"
    where = f"{on_device / 1e9:.2f} GB per GPU" + (f", {host / 1e9:.2f} GB of host RAM per node" if host else "")
    return f"DPO reference: a frozen copy of the model ({where}) and one no-grad forward per micro-step"


def loss_path_bytes(spec: ModelSpec, setup: Setup, grad_elem_bytes: int) -> int:
    """The policy's fused-head buffers at their peak, with the reference forward's transient where it runs.

    The saved label hidden states live from the head's forward to its backward; beside them, at different times:
    the forward's tile buffer and fp32 statistics, the reference forward (one layer's no-grad buffers over the 2 b
    sequences, with its own sliding mask and one layer's SDPA bias where SDPA gets a mask (memory/masks.py), or its
    own head: last hidden state, label hidden states, tile, statistics), and the head's backward
    (fp32 input gradient, the tile again, and a trained head's fp32 weight gradient where the parameter is not fp32:
    autograd then casts it to a second, parameter-dtype gradient)."""
    head = fused_head_parts(spec, setup, label_positions(setup), grad_elem_bytes, int(constant("dpo_logprob_fp32_per_token")))
    reference = 0
    if runs_reference_forward(setup):
        doubled = setup.model_copy(update={"micro_batch_size": 2 * setup.micro_batch_size})
        last_hidden = 2 * setup.micro_batch_size * setup.seq_len * spec.hidden_size * hidden_bytes(setup)
        reference = max(prefill_transient_bytes(spec, doubled, hidden_bytes(setup)) + no_grad_forward_mask_bytes(spec, doubled),
                        last_hidden + head.saved + head.tile + head.stats)
    return head.saved + max(head.forward, reference, head.backward)


def full_logits_path_bytes(spec: ModelSpec, setup: Setup, era: TrlEra) -> int:
    """TRL 1.0-1.14's loss path (memory/dpo_logits.py) on the 2 b rows, with the policy's final soft-cap output and
    the reference forward's own transient (one layer's buffers and its mask) where it runs."""
    doubled = setup.model_copy(update={"micro_batch_size": 2 * setup.micro_batch_size})
    reference = (prefill_transient_bytes(spec, doubled, hidden_bytes(setup)) + no_grad_forward_mask_bytes(spec, doubled)
                 if runs_reference_forward(setup) else None)
    return dpo_logits_bytes(spec, setup, era, installed_transformers(), reference) + final_softcap_bytes(spec, doubled)


def extra_head_flops(spec: ModelSpec, setup: Setup) -> float:
    """Head GEMM FLOPs an SFT step does not run: the fused head's backward recomputes each logits tile (2 V H per
    label position), and the reference forward projects every label position once more (the reference's blocks are
    priced as a forward through ``kernel_factors.recompute``, which leaves the head out)."""
    fused = trl_era(fused_head.installed_trl()).dpo_loss in ("fused", "unpriced")   # TRL 1.0-1.14's head runs no recompute
    heads = (1 if fused else 0) + (1 if runs_reference_forward(setup) else 0)
    return heads * 2.0 * spec.vocab_size * spec.hidden_size * label_positions(setup)


TECHNIQUES = (Dpo(),)
