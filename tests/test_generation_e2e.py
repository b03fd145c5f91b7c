"""Real generation on CPU with tiny models: the predicted KV cache equals the bytes the cache really holds.

The model is created with the plan's model kwargs and generated with the plan's generation kwargs; the
expected bytes are read from the returned cache object's tensors, never from perfguide.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from perfguide.hardware.types import CPU, Hardware  # noqa: E402
from perfguide.memory.inference import estimate_inference  # noqa: E402
from perfguide.model.types import ModelSpec  # noqa: E402
from perfguide.recommendation import Recommendation  # noqa: E402
from perfguide.scenarios import planner  # noqa: E402
from perfguide.scenarios.types import Constraints, Request  # noqa: E402

BASE = dict(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            head_dim=16, max_position_embeddings=128)
PROMPT, NEW, BATCH = 7, 5, 3


def spec_from_module(model: torch.nn.Module, config: transformers.PretrainedConfig) -> ModelSpec:
    """Counts taken from the real module (independent of perfguide's own resolver)."""
    layer0 = model.model.layers[0]
    linears = {name: (m.in_features, m.out_features) for name, m in layer0.named_modules() if isinstance(m, torch.nn.Linear)}
    return ModelSpec(
        name="tiny", model_type=config.model_type, hidden_size=config.hidden_size, num_layers=config.num_hidden_layers,
        num_attention_heads=config.num_attention_heads, num_key_value_heads=config.num_key_value_heads,
        head_dim=config.head_dim, intermediate_size=config.intermediate_size, vocab_size=config.vocab_size,
        sliding_window=getattr(config, "sliding_window", None),
        total_params=sum(p.numel() for p in model.parameters()),
        embedding_params=model.model.embed_tokens.weight.numel(), lm_head_params=model.lm_head.weight.numel(),
        block_linears=linears, config=config.to_dict(),
    )


def cache_bytes(cache: object) -> int:
    return sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values))


def plan_for(spec: ModelSpec, flags: tuple[str, ...] = ()) -> Recommendation:
    cpu = CPU(physical_cores=2, logical_cores=2, ram_total=8 * 2**30, ram_available=4 * 2**30, flags=flags)
    cons = Constraints(prompt_len=PROMPT, max_new_tokens=NEW, batch_size=BATCH)
    request = Request(scenario="infer_cpu", model=spec, hardware=Hardware(cpu=cpu), seq_len=PROMPT,
                      global_batch_size=BATCH, constraints=cons)
    return Recommendation(request=request, **dict(planner("infer_cpu")(request)))


def generate(config: object, plan: Recommendation) -> tuple[object, int]:
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, **plan.model_kwargs()).eval()
    ids = torch.randint(0, config.vocab_size, (BATCH, PROMPT))
    out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, min_new_tokens=NEW,
                         return_dict_in_generate=True, **plan.generation_kwargs())
    assert out.sequences.shape == (BATCH, PROMPT + NEW)
    return model, cache_bytes(out.cache)


def tiny(kind: str, kv_heads: int) -> object:
    if kind == "mistral":
        return transformers.MistralConfig(**BASE, num_key_value_heads=kv_heads, sliding_window=6)
    return transformers.LlamaConfig(**BASE, num_key_value_heads=kv_heads)


def spec_of(config: object) -> ModelSpec:
    return spec_from_module(transformers.AutoModelForCausalLM.from_config(config), config)


@pytest.mark.parametrize("kind,kv_heads,flags,element", [
    ("llama", 4, (), 4),                 # MHA, no native bf16 -> fp32 plan
    ("llama", 2, (), 4),                 # GQA
    ("llama", 1, ("amx_bf16",), 2),      # MQA on an AMX CPU -> bf16 plan
    ("mistral", 2, (), 4),               # sliding window shorter than the generated length
])
def test_dynamic_cache_bytes_exact(kind: str, kv_heads: int, flags: tuple[str, ...], element: int) -> None:
    config = tiny(kind, kv_heads)
    plan = plan_for(spec_of(config), flags)
    model, measured = generate(config, plan)
    assert next(model.parameters()).element_size() == element
    assert plan.setup.cache_implementation == "dynamic"
    assert plan.memory.kv_cache == measured
    # hand check for the full-attention cases: 2 (K,V) x layers x kv_heads x head_dim x (prompt + new - 1) x batch x bytes
    if kind == "llama":
        assert measured == 2 * 2 * kv_heads * 16 * (PROMPT + NEW - 1) * BATCH * element


@pytest.mark.parametrize("kind,kv_heads", [("llama", 4), ("llama", 2), ("mistral", 2)])
def test_static_cache_bytes_exact(kind: str, kv_heads: int) -> None:
    config = tiny(kind, kv_heads)
    spec = spec_of(config)
    plan = plan_for(spec)
    static = plan.setup.replace(cache_implementation="static")
    plan = plan.model_copy(update={"setup": static, "memory": estimate_inference(spec, static, None)})
    assert plan.generation_kwargs()["cache_implementation"] == "static"
    _, measured = generate(config, plan)
    assert plan.memory.kv_cache == measured


def test_model_kwargs_follow_the_plan() -> None:
    config = tiny("llama", 2)
    plan = plan_for(spec_of(config), ("avx512_bf16",))
    kwargs = plan.model_kwargs()
    assert kwargs["dtype"] is torch.bfloat16 and kwargs["attn_implementation"] == "sdpa"
    assert plan.generation_kwargs() == {"max_new_tokens": NEW, "cache_implementation": "dynamic"}
