"""A speech model's two lengths are the model's, not the request's: Whisper's encoder and its labels' bound.

transformers' WhisperEncoder runs exactly ``max_source_positions`` positions: the feature extractor pads every clip to
30 s (3000 log-mel frames) and the encoder refuses any other frame count. So ``seq_len`` (the encoder's length in an
encoder-decoder plan) is set from the model and a different one is refused, not priced. The decoder's length is the
labels': the HF fine-tuning recipe drops labels longer than ``max_target_positions`` (448) and pads each batch to its
longest, so a plan that is not told ``target_len`` prices that bound, the longest batch the recipe can meet.
"""

from __future__ import annotations

from ..decisions import Decision
from ..errors import ConflictingConstraintsError
from ..model.types import ModelSpec
from .types import Constraints

SOURCE = ("transformers models/whisper/modeling_whisper.py WhisperEncoder.forward (expected_seq_length = "
          "max_source_positions x conv strides); huggingface.co/blog/fine-tune-whisper (max_label_length 448)")


def label_bound(spec: ModelSpec) -> int | None:
    """The longest labels the decoder takes (``max_target_positions``), None for a model without one."""
    limit = (spec.config or {}).get("max_target_positions")
    return limit if isinstance(limit, int) else None


def speech_lengths(spec: ModelSpec, training: bool, seq_len: int | None,
                   cons: Constraints) -> tuple[int | None, Constraints, Decision | None]:
    """(seq_len, constraints with the decoder's length, the decision that says so); unchanged for a text model."""
    audio = spec.audio_input
    if audio is None:
        return seq_len, cons, None
    if seq_len is not None and seq_len != audio.positions:
        raise ConflictingConstraintsError(
            f"seq_len={seq_len}: {spec.name}'s encoder always runs {audio.positions} positions ({audio.frames} log-mel frames, every "
            f"clip padded to 30 s); drop seq_len or use seq_len={audio.positions}, and set the labels' length with target_len")
    limit = label_bound(spec)
    field, decoder = ("target_len", cons.target_len) if training else ("max_new_tokens", cons.max_new_tokens)
    if limit is not None and decoder is not None and decoder > limit:
        raise ConflictingConstraintsError(f"{field}={decoder} exceeds {spec.name}'s max_target_positions={limit}, the decoder's "
                                          f"position table; use {field} <= {limit}")
    if training and cons.target_len is None and limit is not None:
        cons = cons.model_copy(update={"target_len": limit})
    decoder_len = cons.target_len if training else cons.max_new_tokens
    reason = (f"the encoder runs {audio.positions} positions for every clip ({audio.mel_bins} mel bins x {audio.frames} frames); "
              f"the decoder {decoder_len} tokens" + (" (max_target_positions: the longest labels a batch can pad to; "
                                                     "pass target_len for shorter transcripts)" if training else ""))
    return audio.positions, cons, Decision(setting="seq_len", value=audio.positions, reason=reason,
                                           number=float(audio.positions), unit="tokens", source=SOURCE)
