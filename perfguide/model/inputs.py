"""What a model reads first: perfguide prices models over token sequences (and Whisper's log-mel frames).

An image, audio, video or time-series encoder built from its config has no token embedding to price a sequence
over; before this check, most such classes built and were priced as language models at 2,048 tokens (CLIP's
vision tower, SAM, BLIP-2, wav2vec2-style and Qwen2-Audio encoders: bench/fuzz.py's model-type walk and
tests/test_model_inputs.py).
"""

from __future__ import annotations

from typing import Any

from ..errors import InvalidModelError
from .types import AUDIO_MODEL_TYPES

#: what a transformers class reads first (``main_input_name``), said in words for the refusal
_INPUT_KINDS = {"pixel_values": "images", "pixel_values_videos": "video frames", "input_values": "raw audio",
                "input_features": "audio features"}


def reads_tokens(module: Any, config: dict[str, Any]) -> None:
    """A module whose first input is not token ids (an image, audio, video or time-series encoder) would be priced
    as a language model over token sequences it never sees: refused in one line. Whisper's log-mel encoder is priced
    (model/types.py ``audio_input``); multimodal language models read ``input_ids`` first."""
    main = getattr(module, "main_input_name", "input_ids")
    if main == "input_ids" or config.get("model_type") in AUDIO_MODEL_TYPES:
        return
    what = _INPUT_KINDS.get(main, "no token ids") if isinstance(main, str) else "no token ids"
    raise InvalidModelError(f"{type(module).__name__} reads {main!r} ({what}), not token ids; perfguide prices language models "
                            "(text, multimodal language models and Whisper): pass a text model's config, module or hub id")
