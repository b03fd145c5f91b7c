"""Which bitsandbytes 4-bit kernel each published throughput row ran (perfguide/speed/dequant.py prices it).

The dequantize kernel's decode changed in bitsandbytes 0.48.0 (a branch tree before, a table lookup after), and the
4-bit code a row used (nf4 or fp4) changes its decode too; neither is in the Setup of a row by default, so the bench
reads them here: the release from each source's date and install notes, the code from the row's notes.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

from _releases import release_as

from perfguide.speed import dequant

#: the bitsandbytes release each source's 4-bit rows ran; every other source quantizes with torchao (torchtune's
#: NF4Tensor) or not at all, and is priced with the newest kernel (None), whose decode hides behind its bytes
BNB_RELEASES: dict[str, str] = {
    # run 2023-08 on torch 2.0.1 / transformers 4.33.0.dev0 (the reports' environment); 0.41.1 (2023-08-03) was the
    # newest release then and 0.42.0 came in 2024-01: a 0.41.x kernel (0.39-0.47 share one, counted in SASS)
    "optimum-benchmark-llama-peft": "0.41.1",
    # fsdp_qlora's README of March 2024 installs 'bitsandbytes>=0.43.0' (the first release with its quant_storage)
    "answerai-fsdp-qlora": "0.43.0",
}


def bnb_release_of(group: str) -> str | None:
    """The bitsandbytes release a source's rows ran, None where they ran none (or the newest)."""
    return BNB_RELEASES.get(group)


def quant_type_fields(row: dict[str, str]) -> dict[str, Any]:
    """A bnb 4-bit row whose config set only load_in_4bit quantized to fp4 (BitsAndBytesConfig's default
    bnb_4bit_quant_type); its notes say so."""
    return {"bnb_4bit_quant_type": "fp4"} if "the 4-bit type is fp4" in row["notes"] else {}


def bnb_release(release: str | None) -> AbstractContextManager[None]:
    """Price inside the block with bitsandbytes ``release`` installed (None: none installed, the newest kernel)."""
    return release_as(dequant, "installed_bitsandbytes", release)
