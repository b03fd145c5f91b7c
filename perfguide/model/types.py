"""The shape of a model, as far as memory and speed are concerned. Never holds weights."""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable
from typing import Any, Literal, NamedTuple, TypeVar

from pydantic import Field, field_serializer, model_validator

from .._base import Model
from .._text import clean_data, plain_name
from ..setup import LoraSpec
from .recurrent import STATE_ONLY, STATEFUL

Dtype = Literal["fp32", "bf16", "fp16"]
Linears = dict[str, tuple[int, int]]
#: what sits on top of the blocks, from ``architectures[0]``: it decides the logits width and whether the model generates
Head = Literal["lm", "sequence_classification", "token_classification", "question_answering", "base", "pretraining", "other"]
#: more layers than any model has (the largest published stacks have a few hundred); every layer is planned
MAX_LAYERS = 10_000
#: cache layer kinds as transformers names them in ``config.layer_types``
#: what one decoder layer keeps in transformers' cache (cache_utils.py LAYER_TYPE_MAPPING): "linear_attention" and
#: "conv" a fixed state (model/recurrent.py), "hybrid" that state and the full K/V, "dummy" nothing
LayerType = Literal["full_attention", "sliding_attention", "chunked_attention", "dummy", "linear_attention", "conv", "hybrid"]


def linear_weight_count(linears: Linears, experts: int = 1) -> int:
    """Weights of one block's Linears; entries named ``experts.*`` describe one expert, so they count ``experts`` times."""
    dense = sum(i * o for k, (i, o) in linears.items() if not k.startswith("experts."))
    expert = sum(i * o for k, (i, o) in linears.items() if k.startswith("experts."))
    return dense + expert * experts


class BlockKind(Model):
    """One kind of block in a stack whose blocks are not all built alike, and the layers built that way: Qwen3.5's
    gated-DeltaNet and full-attention blocks, DeepSeek-V3's dense first layers before its MoE ones, Gemma-4's
    sliding and global attention of two head widths, Nemotron-H's Mamba, attention and MoE blocks."""

    linears: Linears
    layers: tuple[int, ...] = Field(min_length=1)


T = TypeVar("T")
#: Facts derived from a spec (Linear counts, active parameters, the memory ledger per dtype...), kept per spec
#: object: a plan prices hundreds of candidates of one model, and a spec is frozen, so each is computed once per
#: request. Entries hold the spec itself, so its id cannot be reused while cached; a copy is a new object.
_DERIVED: dict[int, tuple[Any, dict[Hashable, Any]]] = {}
_DERIVED_SPECS = 64


def derived(spec: Any, key: Hashable, compute: Callable[[], T]) -> T:
    """``compute()`` for ``spec`` and ``key``, computed on the first call only."""
    entry = _DERIVED.get(id(spec))
    if entry is None or entry[0] is not spec:
        if len(_DERIVED) >= _DERIVED_SPECS:
            del _DERIVED[next(iter(_DERIVED))]          # the oldest spec
        entry = _DERIVED[id(spec)] = (spec, {})
    values = entry[1]
    if key not in values:
        values[key] = compute()
    value: T = values[key]
    return value


#: encoder-only model types: they never generate, whatever their head
_ENCODERS = frozenset({"bert", "roberta", "xlm-roberta", "camembert", "deberta", "deberta-v2", "distilbert", "electra",
                       "albert", "modernbert", "mpnet", "xlm", "ernie"})
#: rows of the position table held back for the padding offset (RoBERTa family: padding_idx 1 -> 2 rows)
_POSITION_OFFSET = {"roberta": 2, "xlm-roberta": 2, "camembert": 2, "longformer": 2, "data2vec-text": 2}



class SparseIndex(NamedTuple):
    """A sparse-attention indexer's shape: the width of its one-head key, its query heads, the positions it picks."""

    head_dim: int
    n_heads: int
    topk: int


#: the speech models whose audio front end perfguide prices (AudioInput): read here, by the tracer's builder and by
#: the rule that refuses every other model that reads no token ids (model/inputs.py)
AUDIO_MODEL_TYPES = frozenset({"whisper"})


class AudioInput(NamedTuple):
    """A speech encoder's fixed input (Whisper): ``mel_bins`` x ``frames`` log-mel features, which two convolutions
    (the second of stride 2) turn into ``positions`` encoder tokens. transformers' WhisperEncoder refuses any other
    frame count ("Whisper expects the mel input features to be of length ..."): the feature extractor pads every clip
    to 30 s, so the encoder's length is the model's, not the data's."""

    mel_bins: int
    frames: int
    positions: int


class ModelSpec(Model):
    """Architecture numbers plus exact parameter counts.

    ``block_linears`` maps each Linear inside one transformer block to ``(in_features, out_features)``
    so that LoRA targets and 8-bit optimizer coverage can be counted exactly rather than guessed.
    Keys are the module paths inside one block as transformers names them (``self_attn.q_proj``), so PEFT's
    suffix matching of ``target_modules`` applies to them. Encoder-decoder models describe the encoder block in
    ``block_linears`` and the decoder block (which adds cross-attention) in ``decoder_block_linears``.
    """

    name: str
    model_type: str = "unknown"            # HF config.model_type, e.g. "llama"
    architecture: str | None = None        # e.g. "LlamaForCausalLM"
    family: str = "generic"                # key into activation coefficients (data/calibration.json)
    hidden_size: int = Field(gt=0)
    num_layers: int = Field(gt=0, le=MAX_LAYERS)
    num_attention_heads: int = Field(gt=0)
    num_key_value_heads: int = Field(gt=0)
    head_dim: int = Field(gt=0)
    intermediate_size: int = Field(gt=0)
    vocab_size: int = Field(gt=0)
    max_position_embeddings: int | None = None
    tie_word_embeddings: bool = False
    gated_mlp: bool = True                 # SwiGLU/GeGLU (3 matrices) vs classic 2-matrix MLP
    num_experts: int = 1                   # routed MoE experts per MoE layer (1 = dense)
    num_experts_per_tok: int = 1
    num_shared_experts: int = Field(default=0, ge=0)  # always-on experts beside the routed ones (DeepSeek, Qwen2-MoE)
    moe_intermediate_size: int | None = None  # one routed expert's width (None: intermediate_size)
    shared_expert_intermediate_size: int | None = None  # total width of the shared expert(s) (None: shared x expert width)
    num_moe_layers: int | None = Field(default=None, ge=0)  # layers with routed experts (None: all, when MoE)
    expert_params: int = Field(default=0, ge=0)  # routed-expert weights over the whole model (exact count)
    #: each routed expert is a module of its own (``experts.0.w1`` ...: remote code, transformers 4): an expert no token
    #: reaches gets no gradient, so DDP must look for unused parameters. transformers 5 fuses a layer's experts into
    #: 3-D tensors (``experts.gate_up_proj``) that get a gradient whenever any expert of the layer is used.
    separate_expert_modules: bool = False
    #: vision tower and projector of a multimodal checkpoint (Gemma-3's SigLIP, Llama-4's encoder): loaded, so in
    #: total_params; a text token never passes through them, so not in active_params (text FLOPs)
    vision_params: int = Field(default=0, ge=0)
    # multi-head latent attention (DeepSeek-V2/V3 and kin); None when the model has plain attention
    kv_lora_rank: int | None = None
    q_lora_rank: int | None = None
    qk_rope_head_dim: int | None = None
    qk_nope_head_dim: int | None = None
    v_head_dim: int | None = None
    head: Head = "lm"
    num_labels: int | None = Field(default=None, gt=0)  # classification / QA heads: logits per position
    is_encoder_decoder: bool = False
    num_decoder_layers: int = Field(default=0, ge=0, le=MAX_LAYERS)           # encoder-decoder only; num_layers counts the encoder then
    sliding_window: int | None = None
    attention_chunk_size: int | None = None  # Llama-4 chunked attention: the window of its chunked layers
    layer_types: tuple[LayerType, ...] | None = None  # per (decoder) layer; None = every layer full, or all sliding if a window is set
    attn_logit_softcapping: float | None = None  # Gemma-2: soft-capped scores, which SDPA cannot do
    #: Gemma-4's full-attention layers: their own head width and K/V heads (None: the config's head_dim and
    #: num_key_value_heads), and the trailing layers that reuse an earlier layer's K/V (no K/V projection, no cache)
    global_head_dim: int | None = Field(default=None, gt=0)
    num_global_key_value_heads: int | None = Field(default=None, gt=0)
    num_kv_shared_layers: int = Field(default=0, ge=0)
    #: MiMo-V2-Flash's attention (non-latent): values narrower than keys (``v_head_dim``; None: ``head_dim``) and its
    #: sliding layers' own K/V head count (twice ``num_key_value_heads``; None: the same)
    value_head_dim: int | None = Field(default=None, gt=0)
    sliding_key_value_heads: int | None = Field(default=None, gt=0)
    #: Gemma-4's per-layer embeddings (E2B / E4B: a 256-wide input each layer adds through a gate and a projection; 0:
    #: none) and its MLPs twice as wide in the layers that reuse K/V (``use_double_wide_mlp``)
    hidden_size_per_layer_input: int = Field(default=0, ge=0)
    double_wide_shared_mlp: bool = False
    #: Gemma 3n's layers whose FFN sparsifies its activation (``activation_sparsity_pattern`` above 0: its first 10)
    sparse_ffn_layers: int = Field(default=0, ge=0)
    supports_sdpa: bool = True             # False: the model class refuses attn_implementation="sdpa" (eager / flash only)
    #: the config's layer types that carry a recurrent state along the sequence (Qwen3-Next's "linear_attention"): a
    #: sequence split restarts that state on every rank, so accelerate refuses Ulysses on them
    recurrent_layer_types: tuple[str, ...] = ()
    #: one recurrent layer's fixed cache per sequence (model/recurrent.py): conv-state elements (activation dtype) and
    #: recurrent-state elements (fp32); 0 for attention-only models
    conv_state_elements: int = Field(default=0, ge=0)
    recurrent_state_elements: int = Field(default=0, ge=0)
    #: the conv kernel width of those layers (conv_state_elements = channels x kernel), and the dtype the config names for
    #: the recurrent state (None: unnamed; transformers keeps it fp32, vLLM in the model dtype)
    conv_state_kernel: int = Field(default=0, ge=0)
    recurrent_state_dtype: Literal["float32", "bfloat16", "float16"] | None = None
    # exact counts
    total_params: int = Field(gt=0)
    embedding_params: int = Field(ge=0)    # input (and position) embeddings
    lm_head_params: int = Field(ge=0)      # 0 when tied to the embedding
    block_linears: Linears = Field(default_factory=dict)
    decoder_block_linears: Linears = Field(default_factory=dict)  # encoder-decoder only; empty = same as block_linears
    #: every kind of block where a decoder-only stack's blocks differ (``block_linears`` is then the last one's); empty:
    #: every block has ``block_linears``
    block_kinds: tuple[BlockKind, ...] = ()
    trainable_params: int | None = Field(default=None, ge=0)  # from a module's requires_grad; None = not known
    native_dtype: Dtype = "fp32"
    source: str = "unknown"                # "catalog", "config", "module", "size", "path", "hub"
    config: dict[str, Any] | None = Field(default=None, repr=False)  # raw HF config dict, for tracing
    # what a live module arrives with (model/adapted.py): planned as it is
    adapter: LoraSpec | None = None        # the LoRA adapter of a PeftModel (the counts above are its base's)
    quantization: Literal["int8", "nf4"] | None = None  # bitsandbytes-quantized Linears of a loaded model

    @field_serializer("config", when_used="json")
    def _inert_config(self, config: dict[str, Any] | None) -> Any:
        """In JSON the raw config's strings are names (ids, classes, dtypes): inert in Markdown / HTML too."""
        return clean_data(config, plain_name)

    @model_validator(mode="after")
    def _kinds_cover_the_stack(self) -> ModelSpec:
        if self.block_kinds and sorted(i for kind in self.block_kinds for i in kind.layers) != list(range(self.num_layers)):
            raise ValueError(f"block_kinds must name each of the {self.num_layers} layers once")
        return self

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 1

    @property
    def active_intermediate_size(self) -> int:
        """MLP width one token passes through: k routed experts plus the shared ones (the dense width otherwise)."""
        if not self.is_moe:
            return self.intermediate_size
        expert = self.moe_intermediate_size or self.intermediate_size
        shared = self.shared_expert_intermediate_size or expert * self.num_shared_experts
        return expert * self.num_experts_per_tok + shared

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank is not None

    @property
    def generates(self) -> bool:
        """Decoder LMs and encoder-decoders append tokens; encoders and task heads answer in one forward pass."""
        if self.head in ("sequence_classification", "token_classification", "question_answering", "pretraining"):
            return False
        if self.is_encoder_decoder:
            return True
        return self.head == "lm" and not (self.architecture or "").endswith("ForMaskedLM") and self.model_type not in _ENCODERS

    @property
    def logits_width(self) -> int:
        """Columns of the head's output per position: the vocabulary for LM heads, the labels for task heads."""
        if self.head in ("sequence_classification", "token_classification"):
            return self.num_labels or 2
        if self.head == "question_answering":
            return 2  # start and end logits
        return 0 if self.head == "base" else self.vocab_size

    @property
    def logits_per_sequence(self) -> bool:
        """Sequence classification scores one position per sequence (the pooled / last token), not every one."""
        return self.head == "sequence_classification"

    @property
    def usable_positions(self) -> int | None:
        """Positions a sequence may really use: RoBERTa-style tables reserve ``padding_idx + 1`` rows (514 -> 512)."""
        limit = self.max_position_embeddings
        if limit is None:
            return None
        return limit - _POSITION_OFFSET.get(self.model_type, 0)

    @property
    def fused_expert_params(self) -> int:
        """Routed-expert weights held as fused 3-D parameters (transformers 5's MoE blocks: Qwen3-MoE, gpt-oss,
        DeepSeek), which ``block_linears`` does not list: no nn.Linear to quantize, shard by name or adapt as one."""
        return 0 if any(k.startswith("experts.") for k in self.block_linears) else self.expert_params

    def attention_layer_types(self) -> tuple[LayerType, ...]:
        """Each (decoder) layer's kind, as the config's ``layer_types`` names it (or its window implies)."""
        layers = self.num_decoder_layers or self.num_layers
        if self.layer_types is not None and len(self.layer_types) == layers:
            return self.layer_types
        kind: LayerType = ("sliding_attention" if self.sliding_window is not None else
                           "chunked_attention" if self.attention_chunk_size is not None else "full_attention")
        return (kind,) * layers

    def cache_layer_types(self) -> tuple[LayerType, ...]:
        """What each (decoder) layer stores in transformers' DynamicCache (cache_utils.get_layer_types_and_kwargs): its
        ``attention_layer_types``, but a layer that reuses an earlier layer's K/V (Gemma-4's ``num_kv_shared_layers``,
        the ``kv_sharing_modes`` "reuse") a "dummy" that stores nothing."""
        kinds = self.attention_layer_types()
        first_shared = len(kinds) - min(self.num_kv_shared_layers, len(kinds))
        return tuple(kind if i < first_shared else "dummy" for i, kind in enumerate(kinds))

    @property
    def stateful_layers(self) -> int:
        """Layers that cache a fixed recurrent state (model/recurrent.py): linear attention, convolutions, hybrids."""
        return sum(kind in STATEFUL for kind in self.cache_layer_types())

    @property
    def kv_layers(self) -> int:
        """Layers whose K/V cache grows with the sequence (every kind but the state-only and the empty ones)."""
        return sum(kind not in STATE_ONLY and kind != "dummy" for kind in self.cache_layer_types())

    @property
    def sparse_index(self) -> SparseIndex | None:
        """DeepSeek Sparse Attention's lightning indexer (DeepSeek-V3.2: ``index_head_dim``, ``index_n_heads``,
        ``index_topk`` in its config.json), None for a model that attends to every cached position."""
        config = self.config or {}
        keys = (config.get("index_head_dim"), config.get("index_n_heads"), config.get("index_topk"))
        return SparseIndex(*keys) if self.is_mla and all(isinstance(k, int) for k in keys) else None  # type: ignore[arg-type]

    @property
    def audio_input(self) -> AudioInput | None:
        """Whisper's log-mel input (``num_mel_bins``, ``max_source_positions`` in its config.json; the frames are
        twice the positions: conv1 keeps the length, conv2 halves it), None for a model that reads tokens."""
        config = self.config or {}
        mel, positions = config.get("num_mel_bins"), config.get("max_source_positions")
        if self.model_type not in AUDIO_MODEL_TYPES or not (isinstance(mel, int) and isinstance(positions, int)):
            return None
        return AudioInput(mel, 2 * positions, positions)

    def kv_elements_per_token(self, kv_heads: int | None = None) -> int:
        """Cached elements per token in one attention layer, as transformers stores them.

        Plain attention keeps K and V per KV head; MLA keeps the compressed latent (``kv_lora_rank``) and the
        shared rope key (``qk_rope_head_dim``) as two one-head tensors (modeling_deepseek_v3.py: "Cache read /
        write is performed while latent KV is still compressed"), so tensor parallelism does not split it; a
        sparse-attention model (DeepSeek-V3.2) caches its indexer's one-head key beside them (modeling_deepseek_v32.py
        ``cache.update_indexer``).
        """
        if self.is_mla:
            index = self.sparse_index
            return (self.kv_lora_rank or 0) + (self.qk_rope_head_dim or 0) + (index.head_dim if index else 0)
        return 2 * (self.num_key_value_heads if kv_heads is None else kv_heads) * self.head_dim

    @property
    def total_layers(self) -> int:
        return self.num_layers + self.num_decoder_layers

    @property
    def outside_embeddings(self) -> int:
        """Parameters outside the embeddings and the output head: all the block Linears can ever hold."""
        return max(0, self.total_params - self.embedding_params - self.lm_head_params)

    def stored_share(self, counted: int) -> float:
        """1, or less when ``counted`` block-Linear weights (one block's Linears times the layers run) exceed what
        the model stores outside its embeddings: ALBERT runs one stored layer 12 times, and a multimodal tree's
        largest block list can be another tower's. The Linears are then counted as often as they are stored."""
        return 1.0 if counted <= self.outside_embeddings else self.outside_embeddings / counted

    def _linear_params(self, experts: int) -> int:
        """Linear weights of all blocks with ``experts`` experts per MoE layer, as stored."""
        return derived(self, ("linear_params", experts), lambda: self._stored_linear_params(experts))

    def linear_stacks(self) -> list[tuple[Linears, int]]:
        """(one block's Linears, the blocks built like it) over the model: each kind of block where they differ, else
        the block for every layer and an encoder-decoder's decoder block for each of its layers."""
        if self.block_kinds:
            return [(kind.linears, len(kind.layers)) for kind in self.block_kinds]
        return [(self.block_linears, self.num_layers), (self.decoder_block_linears or self.block_linears, self.num_decoder_layers)]

    def layer_linears(self) -> list[Linears]:
        """Each (decoder) layer's block Linears, in layer order."""
        if not self.block_kinds:
            return [self.decoder_block_linears or self.block_linears] * (self.num_decoder_layers or self.num_layers)
        layers: list[Linears] = [{} for _ in range(self.num_layers)]
        for kind in self.block_kinds:
            for index in kind.layers:
                layers[index] = kind.linears
        return layers

    @property
    def linear_paths(self) -> list[str]:
        """Every block Linear's path inside its block, once, in every kind of block and both stacks: the names PEFT's
        ``target_modules`` can match."""
        kinds = [kind.linears for kind in self.block_kinds]
        return list(dict.fromkeys(p for lin in (self.block_linears, *kinds, self.decoder_block_linears) for p in lin))

    def _stored_linear_params(self, experts: int) -> int:
        per_layer = [(linear_weight_count(linears, experts), n) for linears, n in self.linear_stacks()]
        share = self.stored_share(sum(w * n for w, n in per_layer))
        return sum(w * math.floor(n * share) for w, n in per_layer)

    @property
    def linear_params(self) -> int:
        """Parameters in the blocks' Linear weights (what LoRA targets and bnb quantizes)."""
        return self._linear_params(self.num_experts)

    @property
    def active_params(self) -> int:
        """Parameters a text token touches (less than total for MoE: routed experts count k of E; never the vision
        tower); drives FLOPs."""
        text = self.total_params - self.vision_params
        if self.expert_params and self.num_experts > 1:
            idle = self.expert_params * (self.num_experts - min(self.num_experts_per_tok, self.num_experts)) // self.num_experts
            return text - idle
        return text - (self._linear_params(self.num_experts) - self._linear_params(self.num_experts_per_tok))

    @classmethod
    def from_any(cls, model: Any, **kwargs: Any) -> ModelSpec:
        """Build from an nn.Module, PretrainedConfig, dict, local path, hub id, catalog name or size ("7b")."""
        from .resolve import spec_from_any

        return spec_from_any(model, **kwargs)
