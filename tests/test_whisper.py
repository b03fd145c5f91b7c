"""Whisper, the speech-to-text model users fine-tune most (the HF 'Fine-Tune Whisper' blog and its Seq2SeqTrainer
recipe), planned as transformers runs it: both stacks counted, the encoder at its fixed 1500 positions, the decoder at
the labels' length, its own block coefficients and its audio front end.

Before this, a Whisper config was priced as ``WhisperForCausalLM`` (its decoder alone: 154M of whisper-small's 242M)
at 2048 tokens of text, with Trainer lines that load the decoder, and every openai/whisper-* id was refused offline.
"""

from __future__ import annotations

from typing import Any

import pytest
from helpers import block_pair_per_row, meta_total

import perfguide
from perfguide import ModelSpec, Setup
from perfguide.errors import ConflictingConstraintsError, InvalidModelError
from perfguide.memory import estimate_memory
from perfguide.memory.activations import spec_family
from perfguide.memory.audio import front_end_bytes
from perfguide.model.catalog import config_of
from perfguide.model.tasks import auto_class

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

# OpenAI's README table (github.com/openai/whisper: tiny 39 M, base 74 M, small 244 M, medium 769 M, large 1550 M,
# turbo 809 M) and the Distil-Whisper cards (756 M, 394 M, 166 M); the relative tolerance each rounding allows
PUBLISHED = [
    ("openai/whisper-tiny", 39e6, 0.04), ("openai/whisper-base", 74e6, 0.02), ("openai/whisper-small", 244e6, 0.01),
    ("openai/whisper-medium", 769e6, 0.01), ("openai/whisper-large-v3", 1550e6, 0.005),
    ("openai/whisper-large-v2", 1550e6, 0.005), ("openai/whisper-large-v3-turbo", 809e6, 0.001),
    ("distil-whisper/distil-large-v3", 756e6, 0.002), ("distil-whisper/distil-medium.en", 394e6, 0.002),
    ("distil-whisper/distil-small.en", 166e6, 0.002),
]

TINY = dict(model_type="whisper", architectures=["WhisperForConditionalGeneration"], d_model=96, encoder_ffn_dim=320,
            decoder_ffn_dim=320, encoder_attention_heads=6, decoder_attention_heads=6, vocab_size=4096, num_mel_bins=80,
            activation_function="gelu", attention_dropout=0.0, activation_dropout=0.0, max_source_positions=96,
            max_target_positions=128, decoder_start_token_id=1, pad_token_id=0, bos_token_id=1, eos_token_id=2,
            suppress_tokens=[], begin_suppress_tokens=[])


def _tiny(layers: int, drop: float = 0.0, **update: Any) -> dict[str, Any]:
    return {**TINY, "encoder_layers": layers, "decoder_layers": layers, "dropout": drop, **update}


@pytest.mark.parametrize("hub, total, rel", PUBLISHED)
def test_totals_match_what_openai_states(hub: str, total: float, rel: float) -> None:
    assert ModelSpec.from_any(hub).total_params == pytest.approx(total, rel=rel)


@pytest.mark.parametrize("hub", ["openai/whisper-small", "openai/whisper-large-v3-turbo", "distil-whisper/distil-large-v2"])
def test_counts_equal_the_module_transformers_builds(hub: str) -> None:
    spec = ModelSpec.from_any(hub)
    assert spec.total_params == meta_total(hub)
    assert spec.architecture == "WhisperForConditionalGeneration" and spec.is_encoder_decoder
    assert (spec.num_layers, spec.num_decoder_layers) == (spec.config["encoder_layers"], spec.config["decoder_layers"])


def test_a_config_counts_both_stacks_not_the_decoder_alone() -> None:
    """WhisperForCausalLM (an assistant model: the decoder alone) is what AutoModelForCausalLM builds from the config."""
    config = transformers.WhisperConfig(d_model=768, encoder_layers=12, decoder_layers=12, encoder_attention_heads=12,
                                        decoder_attention_heads=12, encoder_ffn_dim=3072, decoder_ffn_dim=3072)
    with torch.device("meta"):
        whole = transformers.WhisperForConditionalGeneration(config)
        decoder = transformers.WhisperForCausalLM(config)
    spec = ModelSpec.from_any(config)
    assert spec.total_params == sum(p.numel() for p in whole.parameters()) != sum(p.numel() for p in decoder.parameters())
    assert spec.audio_input == (80, 3000, 1500)


def test_other_speech_models_are_refused_in_one_line() -> None:
    with pytest.raises(InvalidModelError, match="reads 'input_features' \\(audio features\\), not token ids"):
        ModelSpec.from_any(transformers.Speech2TextConfig())


def test_the_plan_runs_the_models_lengths() -> None:
    rec = perfguide.recommend("openai/whisper-small", "train_gpu_one", hardware="a100-80gb")
    assert (rec.setup.seq_len, rec.setup.target_len) == (1500, 448)
    decision = next(d for d in rec.decisions if d.setting == "seq_len")
    assert "1500 positions" in decision.reason and "448" in decision.reason
    short = perfguide.recommend("openai/whisper-small", "train_gpu_one", hardware="a100-80gb", target_len=64)
    assert short.setup.target_len == 64
    same_batch = rec.setup.model_copy(update={"target_len": 64})
    assert estimate_memory(rec.model, same_batch).peak_allocated < rec.memory.peak_allocated


@pytest.mark.parametrize("kwargs, words", [
    (dict(seq_len=2048), "always runs 1500 positions"),
    (dict(target_len=449), "max_target_positions=448"),
])
def test_lengths_the_model_cannot_run_are_refused(kwargs: dict[str, Any], words: str) -> None:
    with pytest.raises(ConflictingConstraintsError, match=words):
        perfguide.recommend("openai/whisper-small", "train_gpu_one", hardware="a100-80gb", **kwargs)


def test_generation_past_the_decoder_positions_is_refused() -> None:
    with pytest.raises(ConflictingConstraintsError, match="max_new_tokens=500 exceeds"):
        perfguide.recommend("openai/whisper-small", "infer_gpu_one", hardware="a100-80gb", max_new_tokens=500)


def test_the_training_lines_load_the_speech_class() -> None:
    rec = perfguide.recommend("openai/whisper-tiny", "train_gpu_one", hardware="a100-80gb")
    code = rec.report()
    assert "AutoModelForSpeechSeq2Seq.from_pretrained" in code and "AutoModelForCausalLM" not in code
    model = transformers.AutoModelForSpeechSeq2Seq.from_config(transformers.WhisperConfig(**{
        k: v for k, v in _tiny(1).items() if k not in ("model_type", "architectures")}))
    assert type(model).__name__ == "WhisperForConditionalGeneration"


def test_whisper_takes_its_own_block() -> None:
    assert spec_family(ModelSpec.from_any(_tiny(2))) == "whisper"


@pytest.mark.parametrize("source, target, regime, attn, drop", [
    (96, 32, {"autocast": "bf16"}, "sdpa", 0.0),          # the recipe: AMP, short labels
    (96, 128, {}, "eager", 0.1),                           # labels longer than the source, score maps and dropout
    (64, 48, {"weights_dtype": "bf16"}, "sdpa", 0.0),      # a 16-bit model
])
def test_blocks_match_a_trace(source: int, target: int, regime: dict[str, Any], attn: str, drop: float) -> None:
    """One encoder + one decoder block of the real WhisperForConditionalGeneration on fake tensors (a two-pair trace
    minus a one-pair trace, at two batch sizes) against the analytic blocks, at a width and lengths the fit did not use."""
    spec = ModelSpec.from_any(_tiny(2, drop, max_source_positions=source))
    traced, priced = block_pair_per_row(lambda pairs: _tiny(pairs, drop), spec, source, target, attn, **regime)
    assert priced == pytest.approx(traced, rel=0.03)


def _saved_by_front_end(model: Any, features: Any, autocast: bool) -> int:
    """Bytes autograd keeps from the real encoder's forward until its first block starts, beyond the batch and the
    weights themselves: saved_tensors_hooks over a CPU forward, each storage counted once (autocast's 16-bit copies of
    the input and the conv weights are storages of their own)."""
    seen: dict[int, int] = {}
    state = {"open": True}
    own = {features.untyped_storage().data_ptr()} | {p.untyped_storage().data_ptr() for p in model.parameters()}

    def pack(t: Any) -> Any:
        if state["open"] and t.untyped_storage().data_ptr() not in own:
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    def close(*_: Any) -> None:
        state["open"] = False

    hook = model.model.encoder.layers[0].register_forward_pre_hook(close)
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), \
                torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            model.model.encoder(features)
    finally:
        hook.remove()
    return sum(seen.values())


@pytest.mark.parametrize("regime", ["fp32", "amp"])
def test_front_end_matches_what_autograd_keeps(regime: str) -> None:
    config = transformers.WhisperConfig(**{k: v for k, v in _tiny(1).items() if k not in ("model_type", "architectures")})
    model = transformers.WhisperForConditionalGeneration(config).train()
    batch, frames = 3, 2 * config.max_source_positions
    features = torch.randn(batch, config.num_mel_bins, frames)
    saved = _saved_by_front_end(model, features, autocast=regime == "amp")
    spec = ModelSpec.from_any(_tiny(1))
    setup = Setup(micro_batch_size=batch, seq_len=96, target_len=32, **({"autocast": "bf16"} if regime == "amp" else {}))
    d, batch_bytes = config.d_model, features.numel() * 4
    bias_casts = 2 * 2 * d if regime == "amp" else 0   # autocast casts the biases too; convolution saves the weights only
    assert front_end_bytes(spec, setup, checkpointed=False) - batch_bytes - bias_casts == saved
    # by hand: d x (2 x frames + positions) activations; under autocast its 16-bit copies of the log-mel input and of
    # the two conv weights (mel x 3 x d and d x 3 x d)
    per, mel = (2 if regime == "amp" else 4), config.num_mel_bins
    casts = batch * mel * frames * 2 + 2 * (mel * 3 * d + d * 3 * d) if regime == "amp" else 0
    assert saved == batch * d * (2 * frames + 96) * per + casts


@pytest.mark.parametrize("batch", [2, 4])
def test_a_checkpointed_eager_step_matches_a_trace(batch: int) -> None:
    """Whisper-small's own widths at its 1500 positions (four blocks per stack), the blog's recipe (AMP, gradient
    checkpointing, eager attention as transformers ran Whisper in 2022): the peak is the encoder's first block's
    recompute and backward, which run last, when every other gradient exists. Before the eager backward's entry for
    Whisper and its place at the end of backward, the priced peak was 0.3 GB per row low."""
    from perfguide.memory.tracing.step import run_step

    config = {**config_of("openai/whisper-small"), "encoder_layers": 4, "decoder_layers": 4, "num_hidden_layers": 4}
    setup = Setup(task="train", micro_batch_size=batch, seq_len=1500, target_len=96, autocast="fp16", optimizer="adamw_torch",
                  gradient_checkpointing=True, attn_implementation="eager")
    traced = max(p.total for p in run_step(config, setup).phases.values())
    assert estimate_memory(ModelSpec.from_any(config), setup).peak_allocated == pytest.approx(traced, rel=0.03)


@pytest.mark.parametrize("finetune", ["full", "lora"])
def test_the_plan_trains_a_real_whisper_on_cpu(tmp_path: Any, finetune: str) -> None:
    """The plan's TrainingArguments, model kwargs and prepare_model on a real (tiny, random) Whisper, through a real
    Trainer step on log-mel batches: the run the plan prices is the one that executes. With LoRA, the LoraConfig sets
    no task type: PeftModelForSeq2SeqLM's forward hands Whisper's decoder input_ids twice and stops (peft#1988)."""
    from helpers import reset_accelerate_state

    config = transformers.WhisperConfig(**{k: v for k, v in _tiny(1, max_source_positions=16, max_target_positions=16,
                                                                   d_model=32, encoder_ffn_dim=64, decoder_ffn_dim=64,
                                                                   encoder_attention_heads=2, decoder_attention_heads=2,
                                                                   vocab_size=64).items()
                                           if k not in ("model_type", "architectures")})
    rec = perfguide.recommend(config, "train_cpu", global_batch_size=2, target_len=8, finetune=finetune)
    assert (rec.setup.seq_len, rec.setup.target_len) == (16, 8)
    cls = getattr(transformers, auto_class(rec.model))   # the class the report's lines load
    assert cls is transformers.AutoModelForSpeechSeq2Seq
    model = rec.prepare_model(cls.from_config(config, **rec.model_kwargs()))
    assert (type(model).__name__, rec.setup.lora is not None) == (("PeftModel", True) if finetune == "lora" else
                                                                  ("WhisperForConditionalGeneration", False))
    rows = [{"input_features": torch.randn(80, 32), "labels": torch.randint(3, 64, (8,))} for _ in range(4)]
    reset_accelerate_state()
    args = rec.training_args(output_dir=str(tmp_path), max_steps=1, report_to=[])
    out = transformers.Trainer(model=model, args=args, train_dataset=rows).train()
    assert out.global_step == 1 and out.training_loss > 0


#: transformers' own Whisper command (examples/pytorch/speech-recognition/README.md, 'Single GPU Whisper Training', at
#: huggingface/transformers@02f6103a): "On a single V100, training should take approximately 8 hours"
EXAMPLE_COMMAND = (
    "python run_speech_recognition_seq2seq.py --model_name_or_path=openai/whisper-small "
    "--dataset_name=mozilla-foundation/common_voice_11_0 --dataset_config_name=hi --language=hindi --task=transcribe "
    "--train_split_name=train+validation --eval_split_name=test --max_steps=5000 --output_dir=./whisper-small-hi "
    "--per_device_train_batch_size=16 --gradient_accumulation_steps=2 --per_device_eval_batch_size=16 --logging_steps=25 "
    "--learning_rate=1e-5 --warmup_steps=500 --eval_strategy=steps --eval_steps=1000 --save_strategy=steps --save_steps=1000 "
    "--generation_max_length=225 --preprocessing_num_workers=16 --max_duration_in_seconds=30 --text_column_name=sentence "
    "--freeze_feature_encoder=False --gradient_checkpointing --fp16 --do_train --do_eval --predict_with_generate")


def test_check_prices_the_example_command_at_the_models_lengths() -> None:
    """It had guessed 2,048 tokens for a model whose encoder runs 1500 and said 'does NOT fit: 29.1 GiB' on the V100
    transformers' README runs this command on; Seq2SeqTrainingArguments' own flags were 'unknown'."""
    c = perfguide.check(None, EXAMPLE_COMMAND.split(), hardware="v100-16gb")
    assert (c.setup.seq_len, c.setup.target_len, c.setup.micro_batch_size, c.setup.gradient_accumulation_steps) == (1500, 448, 16, 2)
    assert c.fits and c.memory.device_total < 15.8 * 2**30
    ignored = " ".join(c.ignored)
    assert "predict_with_generate" in ignored and "generation_max_length" in ignored
