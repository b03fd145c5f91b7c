"""Whisper's audio front end in a training step: the log-mel batch and what its two convolutions keep for backward.

transformers' WhisperEncoder.forward runs ``gelu(conv2(gelu(conv1(input_features))))`` before the first block, on
``frames`` = 2 x ``positions`` time steps (conv1 keeps the length, conv2's stride halves it), then adds the frozen
position table. What autograd keeps from it, per batch row, at ``e`` bytes per activation element:

* conv1's input, for its weight gradient: the log-mel batch itself, or autocast's 16-bit copy of it (mel x frames);
* gelu's input and conv2's input: conv1's output and its gelu (d x frames each);
* the second gelu's input: conv2's output (d x positions). Its gelu output goes into the position add, which keeps
  nothing; the sum is the first block's input, priced with the blocks (memory/seq2seq.py).

Under autocast the two conv weights are cast once per forward and cached (2 B per parameter), as the Linears' are.
The log-mel batch itself (fp32 from the feature extractor, or the model's dtype where the model is loaded in 16
bits) is on the device through the step. With the front end frozen (LoRA on the blocks) conv1 records nothing, and the
rest only where gradient checkpointing's input hook makes conv1's output require grad
(``enable_input_require_grads``, which peft's ``prepare_model_for_kbit_training`` also registers).

Checked against the real module (tests/test_whisper.py): what autograd saves (saved_tensors_hooks) over a CPU forward
up to the first block, to the byte, in fp32 and under autocast.
"""

from __future__ import annotations

from ..model.types import ModelSpec
from ..setup import Setup
from .activations import regime

#: conv1 (kernel 3, padding 1) and conv2 (kernel 3, stride 2, padding 1): transformers WhisperEncoder.__init__
KERNEL = 3


def conv_params(spec: ModelSpec) -> int:
    """The two convolutions' weights and biases."""
    audio, d = spec.audio_input, spec.hidden_size
    return 0 if audio is None else (audio.mel_bins * KERNEL * d + d) + (d * KERNEL * d + d)


def front_end_bytes(spec: ModelSpec, setup: Setup, *, checkpointed: bool) -> int:
    """Bytes the audio front end holds at the end of forward for one micro-batch: the batch, the saved conv chain
    and autocast's cached conv weights; 0 for a model that reads tokens. ``checkpointed``: the blocks are recomputed
    (gradient checkpointing), whose input hook makes a frozen front end's output require grad."""
    audio = spec.audio_input
    if audio is None or setup.task != "train":
        return 0
    b, d, kind = setup.micro_batch_size, spec.hidden_size, regime(setup)
    act = 4 if kind == "fp32" else 2
    batch = b * audio.mel_bins * audio.frames * (2 if kind == "half" else 4)
    chain = b * d * (2 * audio.frames + audio.positions) * act
    frozen = setup.lora is not None
    if frozen:
        saved = chain if checkpointed else 0
    else:
        saved = chain + (b * audio.mel_bins * audio.frames * 2 if kind == "amp" else 0)   # conv1's input: autocast's copy
    casts = 2 * conv_params(spec) if kind == "amp" and not frozen else 0
    return batch + saved + casts
