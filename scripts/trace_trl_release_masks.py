"""Which attention masks reach SDPA in a TRL step, per layer kind, for the batches TRL's own collators build: run on
the release's code (TRL v1.15.0 and transformers 5.19.0 on PYTHONPATH) or the installed one.

Why: TRL v1.15.0's gemma-3-1b max-context rows 1181 and 1183-1185 fit 19-31% longer in the replays than published.
One lead was that the real run materialised the full-attention layers' mask as well (+1 B per row x s^2 kept for
the recompute, plus its bias there), which a fake-tensor trace does by reading its inputs as "tracing"
(validation.md section 28 removed it). transformers' masking_utils returns no mask for a full-attention layer, so SDPA
takes ``is_causal``, when the 2-D attention mask is all ones (``_ignore_causal_mask_sdpa``); TRL's collators pad to
the batch's longest sequence (``pad_to_multiple_of`` None by default): SFT at batch 1 is never padded, a DPO pair
only when chosen and rejected differ in length after truncation at max_length. This records it on real CPU tensors:
a tiny Gemma 3 (5 sliding + 1 full layer, window 16, bf16, SDPA, non-reentrant checkpointing), one forward and
backward per batch, every SDPA call's mask (None, or its shape, dtype and storage) by layer kind and phase. The
masks the checkpointed blocks keep are the distinct mask storages SDPA receives.

Run: ``PYTHONPATH=/tmp/tf519:/tmp/trl-1.15.0 .venv/bin/python scripts/trace_trl_release_masks.py`` (the wheels
unpacked: ``pip download --no-deps trl==1.15.0 transformers==5.19.0 -d /tmp/w``; 5.19.0 is the transformers release
current on TRL v1.15.0's date, 2026-10-08: its wheel was built 2026-10-06, 5.20.0's 2026-10-15); without PYTHONPATH
it runs the installed releases.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from trace_trl_gemma import VOCAB, tiny_gemma3  # the traced model of tests/test_trl_gemma_trace.py

S = 256
#: (name, rows per step) of the batches traced: SFT one sequence; SFT two of unequal length (padded); a DPO pair
#: whose chosen and rejected both reach max_length (unpadded); a pair whose rejected completion is shorter (padded)
CASES = (("sft", 1), ("sft_padded", 2), ("dpo", 2), ("dpo_padded", 2))


def collated(case: str, s: int = S) -> dict[str, Any]:
    """The batch TRL's collator makes for ``case`` (the installed trl's, or the release's on PYTHONPATH)."""
    from trl.trainer.dpo_trainer import DataCollatorForPreference
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    ids = [4 + (7 * i) % (VOCAB - 4) for i in range(s)]
    if case.startswith("sft"):
        rows = [{"input_ids": ids}] + ([{"input_ids": ids[: s // 2]}] if case == "sft_padded" else [])
        return dict(DataCollatorForLanguageModeling(pad_token_id=0)(rows))
    prompt, short = s // 4, (s // 4 if case == "dpo_padded" else 0)
    example = {"prompt_ids": ids[:prompt], "chosen_ids": ids[prompt:], "rejected_ids": ids[prompt:s - short]}
    batch = dict(DataCollatorForPreference(pad_token_id=0, max_length=s)([example]))
    return {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}


def sdpa_masks(case: str, s: int = S) -> list[tuple[str, str, Any]]:
    """(phase, layer kind, mask) for every SDPA call of one forward and backward: mask None (SDPA's is_causal), or
    (shape, dtype, storage data pointer, storage bytes)."""
    import torch.nn.functional as F

    model = tiny_gemma3(s)
    enable = getattr(model, "activation_checkpointing_enable", None)
    if enable is not None:   # transformers >= 5.2x
        enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    kinds, calls, phase, layer = model.config.layer_types, [], ["forward"], [0]
    for i, block in enumerate(model.model.layers):
        def pre(_mod: Any, _args: Any, i: int = i) -> None:
            layer[0] = i
        block.self_attn.register_forward_pre_hook(pre)
    original = F.scaled_dot_product_attention

    def spy(*args: Any, **kwargs: Any) -> Any:
        mask = kwargs.get("attn_mask", args[3] if len(args) > 3 else None)
        seen = None if mask is None else (tuple(mask.shape), str(mask.dtype).removeprefix("torch."),
                                          mask.untyped_storage().data_ptr(), mask.untyped_storage().nbytes())
        calls.append((phase[0], kinds[layer[0]], seen))
        return original(*args, **kwargs)

    batch = collated(case, s)
    F.scaled_dot_product_attention = spy
    try:
        out = model(**batch, use_cache=False)
        phase[0] = "recompute"
        out.logits.float().sum().backward()
    finally:
        F.scaled_dot_product_attention = original
    return calls


def kept_mask_bytes(calls: list[tuple[str, str, Any]]) -> dict[str, int]:
    """Bytes of the distinct mask storages SDPA received, by layer kind: the masks built once before the decoder loop
    and kept by the checkpointed blocks for their recompute."""
    seen: dict[tuple[str, int], int] = {}
    for _phase, kind, mask in calls:
        if mask is not None:
            seen[(kind, mask[2])] = mask[3]
    return {kind: sum(b for (k, _), b in seen.items() if k == kind) for kind in ("sliding_attention", "full_attention")}


def main() -> int:
    import warnings

    import transformers
    import trl
    from transformers.utils import logging

    warnings.filterwarnings("ignore")
    logging.set_verbosity_error()
    print(f"trl {trl.__version__}, transformers {transformers.__version__}; tiny Gemma 3, s = {S}")
    for case, rows in CASES:
        calls = sdpa_masks(case)
        print(f"\n== {case}: {rows} row(s) x {S}; attention_mask zeros: "
              f"{int((collated(case)['attention_mask'] == 0).sum())}")
        for kind in ("sliding_attention", "full_attention"):
            masks = {m[:2] if m else None for p, k, m in calls if k == kind}
            print(f"   {kind:18s} SDPA masks {sorted(map(str, masks))}")
        kept = kept_mask_bytes(calls)
        print("   kept by the checkpointed blocks: " + ", ".join(f"{k} {b / (rows * S * S):.0f} B per row x s^2"
                                                               for k, b in kept.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
