"""Models that read no token ids are refused in one line, not priced as language models.

A walk over transformers' model types (default configs, ModelSpec.from_any) found 45 classes whose first input
(``main_input_name``) is images, audio, video frames or time series: CLIP's and SigLIP's vision towers, SAM, BLIP-2,
Mask2Former, wav2vec2-style and Qwen2-Audio encoders, TimesFM... Each built, and a plan priced it over 2,048 tokens
it never reads. Whisper is the exception perfguide prices (tests/test_whisper.py).
"""

from __future__ import annotations

import pytest

from perfguide import ModelSpec
from perfguide.errors import InvalidModelError

transformers = pytest.importorskip("transformers")


@pytest.mark.parametrize("config, reads", [
    ("CLIPVisionConfig", "'pixel_values' (images)"),
    ("SiglipVisionConfig", "'pixel_values' (images)"),
    ("SamConfig", "'pixel_values' (images)"),
    ("Blip2Config", "'pixel_values' (images)"),
    ("SEWDConfig", "'input_values' (raw audio)"),
    ("Qwen2AudioEncoderConfig", "'input_features' (audio features)"),
    ("TimesFmConfig", "'past_values' (no token ids)"),
])
def test_a_model_that_reads_no_tokens_is_refused(config: str, reads: str) -> None:
    cfg = getattr(transformers, config)()
    with pytest.raises(InvalidModelError, match="not token ids") as err:
        ModelSpec.from_any(cfg)
    message = str(err.value)
    assert reads in message and "\n" not in message and "pass a text model" in message


@pytest.mark.parametrize("config", ["LlamaConfig", "BertConfig", "T5Config", "WhisperConfig", "LlavaConfig"])
def test_models_that_read_tokens_still_resolve(config: str) -> None:
    """Text models, an encoder-decoder, Whisper's priced audio encoder and a multimodal language model (LLaVA reads
    input_ids first; its vision tower is counted with the model)."""
    assert ModelSpec.from_any(getattr(transformers, config)()).total_params > 0
