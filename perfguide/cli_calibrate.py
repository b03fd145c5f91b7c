"""``perfguide calibrate``: plan for this machine, train a few real steps of that plan, record the ratios.

Only a plan that fits is run: training a plan whose own verdict is "does not fit" would measure an OOM (or
a swap storm on CPU), and calibrating on that would be worse than not calibrating.
"""

from __future__ import annotations

import argparse
import warnings
from typing import Any

from .errors import PerfGuideError
from .measure.calibration import sane, step_spread
from .memory.factors import SANE_RATIO
from .recommendation import Recommendation

#: Architecture-name endings -> the transformers auto class that builds a trainable model with a loss from
#: input_ids + labels (what verify()'s random token rows provide).
AUTO_CLASSES = (("ForCausalLM", "AutoModelForCausalLM"), ("LMHeadModel", "AutoModelForCausalLM"),
                ("ForConditionalGeneration", "AutoModelForSeq2SeqLM"), ("ForMaskedLM", "AutoModelForMaskedLM"))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", nargs="?", default="gpt2", help="catalog name, config path or hub id (built from its config with random weights)")
    parser.add_argument("--steps", type=int, default=3, help="optimizer steps to measure (default 3)")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--global-batch-size", type=int, default=4)


def auto_class_name(rec: Recommendation) -> str:
    """The auto class for the plan's architecture, or one line saying which architectures can be calibrated."""
    arch = rec.model.architecture or ""
    if rec.model.audio_input:
        raise PerfGuideError(f"perfguide calibrate trains on random token batches; {rec.model.name!r} ({arch}) reads log-mel audio "
                             "features, which it does not make: calibrate a text model of this machine instead")
    for suffix, cls in AUTO_CLASSES:
        if arch.endswith(suffix) and (cls != "AutoModelForSeq2SeqLM" or rec.model.is_encoder_decoder):
            return cls
    if not arch and not rec.model.is_encoder_decoder:
        return "AutoModelForCausalLM"
    accepted = ", ".join(f"*{s}" for s, _ in AUTO_CLASSES)
    raise PerfGuideError(f"perfguide calibrate trains a language-model head; {rec.model.name!r} is {arch or 'an encoder-decoder'}; "
                         f"accepted architectures: {accepted}")


def build_model(rec: Recommendation) -> Any:
    """A randomly initialised model of the plan's config, in the plan's dtype; any failure is one line."""
    import transformers

    cls = getattr(transformers, auto_class_name(rec))
    try:
        config = transformers.AutoConfig.for_model(**rec.model.config)  # type: ignore[arg-type]
        if rec.model.is_encoder_decoder and getattr(config, "decoder_start_token_id", None) is None:
            config.decoder_start_token_id = config.pad_token_id or 0  # T5's convention: the decoder starts at <pad>
        return cls.from_config(config, **{k: v for k, v in rec.model_kwargs().items() if k == "dtype"})
    except Exception as exc:
        reason = (str(exc).strip().splitlines() or [""])[0][:200]
        raise PerfGuideError(f"cannot build {rec.model.name!r} from its config for calibration ({type(exc).__name__}: {reason}); "
                             "pass a catalog name or a config of a causal or masked LM") from exc


def outlier_note(ratio: float) -> str:
    """What a ratio outside the band of the model's own error means for the store: it is kept, not dropped."""
    if sane(ratio):
        return ""
    lo, hi = SANE_RATIO
    return (f"\n{'':>17}outlier: outside the {lo:g}-{hi:g}x band the model's own error spans (a loaded machine, or fixed "
            f"per-step overheads dominating a small model); recorded and used as this machine's first measurement "
            f"(capped at {lo:g}-{hi:g}x) until sane runs of this model size replace it")


def refuse_if_not_fitting(rec: Recommendation) -> None:
    if rec.fits:
        return
    mem = rec.memory
    need = f"{mem.device_total / 2**30:.1f} GiB" + (f" of {mem.capacity / 2**30:.1f} GiB" if mem.capacity else "")
    raise PerfGuideError(f"the plan for {rec.model.name!r} does not fit this machine ({need}), so calibrating on it would measure "
                         "an out-of-memory run; use a smaller model, or a lower --seq-len / --global-batch-size")


def main(args: argparse.Namespace) -> int:
    """Plan for this machine, run it for a few steps, record the measured/predicted ratios."""
    from .api import recommend
    from .hardware import probe
    from .measure.calibration import record
    from .measure.verify import verify

    if args.steps < 1:
        raise PerfGuideError(f"--steps must be >= 1, got {args.steps}")
    hw = probe()
    scenario = "train_gpu_one" if hw.has_gpu else "train_cpu"
    rec = recommend(args.model, scenario, hardware=hw, seq_len=args.seq_len, global_batch_size=args.global_batch_size)
    if not rec.model.config:
        raise PerfGuideError(f"{args.model!r} has no config to build a model from; pass a catalog name or a config path")
    refuse_if_not_fitting(rec)
    model = build_model(rec)
    if hw.has_gpu:
        model = model.to("cuda")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the comparisons are printed below; the callback's warnings would repeat them
        try:
            result = verify(model, rec, steps=args.steps)
        except PerfGuideError:
            raise
        except Exception as exc:  # a model the Trainer cannot step is one line, never a traceback from inside it
            reason = (str(exc).strip().splitlines() or [""])[0][:200]
            raise PerfGuideError(f"the calibration run of {rec.model.name!r} failed ({type(exc).__name__}: {reason}); "
                                 "use a causal LM from the catalog (e.g. gpt2) or its config path") from exc
    if result.oom:
        print(f"out of memory: {result.error}; nothing recorded")
        return 1
    spread = step_spread(result.measured.step_times_s) if result.measured else None
    for c in result.comparisons:
        noise = f", steps spread +/-{spread:.0%}" if c.quantity == "step_time_s" and spread is not None else ""
        print(f"{c.quantity:>15}: predicted {c.predicted:.4g} {c.unit}, measured {c.measured:.4g} {c.unit} (x{c.ratio:.2f}{noise})"
              f"{outlier_note(c.ratio)}")
    path = record(rec, result)
    if path is None:
        print("not recorded: the calibration store could not be written (see the warning above)")
        return 1
    print(f"recorded in {path}")
    return 0
