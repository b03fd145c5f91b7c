"""transformers ``generate``: the model runs in the user's own script (the default engine).

Its plan is the inference rules' (perfguide/scenarios/inference_rules.py: dtype, bitsandbytes int8/nf4 loaded
in-flight, device_map / tp_plan layouts, batch and cache), priced by perfguide/memory/inference.py; its
outputs are the adapters' ``model_kwargs()`` and ``generation_kwargs()``, so it has no server command.
"""

from __future__ import annotations

from typing import ClassVar

from .base import LibraryEngine


class Transformers(LibraryEngine):
    name: ClassVar[str] = "transformers"
    title: ClassVar[str] = "transformers generate"
    default: ClassVar[bool] = True
    order: ClassVar[int] = 0
    docs_source: ClassVar[str] = "transformers docs: llm_optims.md, perf_infer_gpu_one.md, perf_infer_gpu_multi.md"
    summary: ClassVar[str] = ("this plan's model_kwargs() / generation_kwargs() run transformers' generate, which verify() "
                              "and the callback can check on this machine")
    formats_in_script: ClassVar[tuple[str, ...]] = ("int8", "nf4")   # bitsandbytes, quantized at load


ENGINE = Transformers()
