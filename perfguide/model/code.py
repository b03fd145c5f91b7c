"""The model as the code that runs it builds it, where that differs from the Hub checkpoint's own layout.

litgpt's ``GPT`` (litgpt/model.py and litgpt/lora.py, read in litgpt 0.3.1 and 0.4.12) declares ``self.lm_head =
nn.Linear(config.n_embd, config.padded_vocab_size)`` beside ``transformer.wte = nn.Embedding(config.padded_vocab_size,
config.n_embd)`` and never shares their weights: only its pretraining script ties them (``train.tie_embeddings``), and
its fine-tuning scripts refuse that argument (``unsupported = [(train, [..., "tie_embeddings", ...])]``); its
checkpoint converter (scripts/convert_hf_checkpoint.py: ``if "lm_head.weight" not in state_dict:
state_dict["lm_head.weight"] = state_dict["transformer.wte.weight"]``) fills the head from a tied Hub checkpoint's
embedding, and loading copies it into the head's own parameter. A Hub model with tied embeddings (Gemma,
Llama-3.2-1B/3B, ...) therefore holds vocabulary x hidden parameters more under litgpt: their weight always, their
gradient and optimizer state when the head trains (full fine-tuning). Traced on real CPU tensors (litgpt 0.4.12,
one- and two-block Llama-3- and Gemma-shaped GPTs at vocabulary 1024, scripts/trace_litgpt.py): the model's bytes
are the Hub count plus the 1024 x hidden copy. litgpt's padded_vocab_size equals the Hub config's vocab_size (the
embedding rows the checkpoint stores) for the bench's models, so the copy is vocab_size x hidden.

transformers' own Llama-4 MoE (data/architectures.json ``every_expert_model_types``) runs every expert over every token
and zeroes the unrouted outputs with the router's scores: under transformers a Llama-4 token computes and keeps what a
top-k of all its experts would (Scout: 16 of 16, 107.7B matmul parameters a token where the router picks 17.2B's
worth). Traced on a tiny Llama-4 block (tests/test_every_expert.py): what it saves for backward and its matmul FLOPs
are the all-experts counts. Engines that route (vLLM, SGLang) are priced with the checkpoint's top-k.
"""

from __future__ import annotations

from ..errors import InvalidSetupError
from .catalog import catalog_file
from .types import Linears, ModelSpec, derived


def built_by(spec: ModelSpec, model_code: str, linearized: bool = False) -> ModelSpec:
    """``spec`` as ``model_code`` builds it: under litgpt a tied decoder gets an LM head of its own; under
    transformers a Llama-4 token runs through every expert, whose projections are Linears of their own where
    ``linearized`` (``Setup.linearized_experts``); otherwise ``spec`` itself."""
    every = _runs_every_expert(spec)
    if linearized and not (every and spec.fused_expert_params):
        raise InvalidSetupError(f"linearized_experts rebuilds a Llama-4's fused experts as Linears (axolotl's "
                                f"llama4_linearized_experts); {spec.name} is {spec.model_type!r}, whose experts it does not touch "
                                f"(axolotl skips the key there): drop it")
    if model_code == "transformers" and every:
        return derived(spec, ("built_by", model_code, linearized), lambda: _every_expert(spec, linearized))
    if model_code != "litgpt" or spec.lm_head_params or spec.head != "lm" or spec.is_encoder_decoder:
        return spec

    def untie() -> ModelSpec:
        head = spec.vocab_size * spec.hidden_size
        trainable = None if spec.trainable_params is None else spec.trainable_params + head   # the copy trains too
        return spec.model_copy(update={"lm_head_params": head, "total_params": spec.total_params + head,
                                       "trainable_params": trainable, "tie_word_embeddings": False})

    return derived(spec, ("built_by", model_code), untie)


def _runs_every_expert(spec: ModelSpec) -> bool:
    """transformers' modeling of this MoE runs every expert over every token (``every_expert_model_types``)."""
    return spec.is_moe and spec.model_type in catalog_file().every_expert_model_types.value


def _every_expert(spec: ModelSpec, linearized: bool) -> ModelSpec:
    """Every expert a token's (top-k = experts); linearized, each MoE block (the one with a router) lists its experts'
    gate / up / down projections as ``experts.*`` Linears, counted once per expert (linears.linear_shapes), so
    ``fused_expert_params`` is 0 and QLoRA quantizes them (axolotl: nn.ModuleList of nn.Linear per projection)."""
    h, width = spec.hidden_size, spec.moe_intermediate_size or spec.intermediate_size
    experts = {"experts.gate_projs": (h, width), "experts.up_projs": (h, width), "experts.down_projs": (width, h)}

    def add(linears: Linears) -> Linears:
        return {**linears, **experts} if linearized and any(k.endswith("router") for k in linears) else linears

    kinds = tuple(kind.model_copy(update={"linears": add(kind.linears)}) for kind in spec.block_kinds)
    return spec.model_copy(update={"num_experts_per_tok": spec.num_experts, "block_linears": add(spec.block_linears),
                                   "block_kinds": kinds, "separate_expert_modules": linearized or spec.separate_expert_modules})


def every_expert_note(spec: ModelSpec, model_code: str) -> str | None:
    """The plan's word on a model whose code runs every expert (``every_expert_model_types``), where a reader would
    expect the checkpoint's top-k."""
    if model_code != "transformers" or not _runs_every_expert(spec):
        return None
    return (f"transformers runs every one of {spec.name}'s {spec.num_experts} experts over every token (its router's scores "
            f"zero the unpicked outputs): FLOPs and activations priced for {spec.num_experts} experts a token, not its "
            f"top-{spec.num_experts_per_tok}; vLLM and SGLang route")
