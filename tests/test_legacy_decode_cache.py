"""generate's decode cache under older transformers releases (bench/accuracy_prefill.py ``previous_cache_bytes``).

Up to 4.41 generate passes the legacy tuple cache and keeps the previous step's tuple referenced while the model
builds the next one, so each decode forward ends with two whole caches; from 4.42 it passes a Cache object updated in
place. scripts/trace_legacy_decode_cache.py counts the cache tensors alive as each decode forward returns: run here on
the installed release (one cache), and on an older one where PERFGUIDE_TRANSFORMERS_441 names a directory holding
transformers 4.41.2 (pip --target, as the script's docstring shows). The bytes are checked by hand on Llama-2-13B,
and against optimum's GPTQ benchmark table, whose fp16 rows grow by two caches per sequence.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import load_bench, load_script, published_rows

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "trace_legacy_decode_cache.py"
ROWS = published_rows()


def _layers() -> int:
    return load_script("trace_legacy_decode_cache").LAYERS


def _trace(pythonpath: str | None = None) -> dict:  # type: ignore[type-arg]
    """The script's JSON line from a fresh process (its count of live tensors must not see this one's)."""
    env = {**os.environ, **({"PYTHONPATH": pythonpath} if pythonpath else {})}
    out = subprocess.run([sys.executable, str(SCRIPT)], env=env, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_the_installed_release_keeps_one_cache() -> None:
    traced = _trace()
    prompt, n = load_script("trace_legacy_decode_cache").PROMPT, 2 * _layers()
    # every decode forward ends with one tensor per layer for keys and one for values, at the new length only
    assert traced["steps"][1:] == [{str(prompt + k): n} for k in range(1, 6)]


@pytest.mark.skipif(not os.environ.get("PERFGUIDE_TRANSFORMERS_441"), reason="set PERFGUIDE_TRANSFORMERS_441 to a "
                    "directory holding transformers 4.41.2 (see scripts/trace_legacy_decode_cache.py)")
def test_a_release_before_4_42_keeps_the_previous_cache_too() -> None:
    traced = _trace(os.environ["PERFGUIDE_TRANSFORMERS_441"])
    assert traced["transformers"].startswith("4.41")
    prompt, n = load_script("trace_legacy_decode_cache").PROMPT, 2 * _layers()
    assert traced["steps"][1:] == [{str(prompt + k - 1): n, str(prompt + k): n} for k in range(1, 6)]


def _infer_row(row_id: str):  # type: ignore[no-untyped-def]
    row = ROWS[row_id]
    spec = load_bench("accuracy_spec")._spec(row["model_hf_id"])
    return spec, load_bench("accuracy_setup")._infer_setup(row, spec)


def test_previous_cache_by_hand() -> None:
    """Llama-2-13B (40 layers, 40 key/value heads of 128, fp16): 819,200 B of cache per token; at batch 16, a 512-token
    prompt and 512 new tokens the last decode forward builds a 1,023-position cache (the last sampled token is never
    fed back) and the older release also holds the 1,022-position one before it."""
    prefill = load_bench("accuracy_prefill")
    accuracy = load_bench("accuracy")
    spec, setup = _infer_row("559")
    assert (setup.micro_batch_size, setup.seq_len, setup.new_tokens) == (16, 512, 512)
    est = accuracy.estimate_memory(spec, setup, None)
    per_token = 2 * 40 * 40 * 128 * 2
    assert est.kv_cache == 16 * 1023 * per_token
    assert prefill.previous_cache_bytes(est, spec, setup, "4.32.0") == 16 * 1022 * per_token
    assert prefill.previous_cache_bytes(est, spec, setup, "4.42.0") == 0
    spec, setup = _infer_row("575")   # prefill only: one new token, nothing decoded
    assert prefill.previous_cache_bytes(accuracy.estimate_memory(spec, setup, None), spec, setup, "4.32.0") == 0


def test_the_published_table_grows_by_two_caches_per_sequence() -> None:
    """optimum's fp16 Llama-2-13B rows (512 + 512 tokens): 29,153 MB at batch 1, 53,986.5 MB at 16, 1,655.6 MB per
    added sequence; one 1,024-token cache is 838.9 MB, so the table grows by 1.97 caches a sequence."""
    one, sixteen = float(ROWS["547"]["peak_mem_value"]), float(ROWS["559"]["peak_mem_value"])
    cache_mb = 1024 * 2 * 40 * 40 * 128 * 2 / 1e6
    assert 1.9 < (sixteen - one) / 15 / cache_mb < 2.05
    accuracy = load_bench("accuracy")
    a, b = accuracy.evaluate(ROWS["547"], []), accuracy.evaluate(ROWS["559"], [])
    assert abs((b.predicted - a.predicted) - (sixteen - one)) < 0.03 * (sixteen - one)
