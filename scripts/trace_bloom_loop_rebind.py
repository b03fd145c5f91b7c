"""Trace the training loop of PEFT's peft_lora_clm_accelerate_ds_zero3_offload.py (@83ded43e, the run of peft issue #76,
row 2500) on a small BloomForCausalLM of transformers 4.26.1, and print the loop's 'max-begin' with and without the
previous step's output alive.

The script's loop is ``for step, batch in ...: outputs = model(**batch); loss = outputs.loss; ...
accelerator.backward(loss)``: the name is rebound only when the next forward returns, so the previous output (its fp32
logits and the ``past_key_values`` Bloom returns whenever ``config.use_cache`` is true) is alive through that forward's
loss. Bloom 4.26.1's attention builds its returned key and value by ``reshape`` of permuted views (copies that the
step's own autograd graph saves anyway); once that graph is freed, the previous output's copies are the only owners.

Run with the release's wheel and its hub dependencies unpacked on the path (no install):
``pip download --no-deps transformers==4.26.1 huggingface_hub==0.12.1 requests==2.28.2 urllib3==1.26.14 idna==3.4
charset-normalizer==3.0.1 certifi==2022.12.7 -d /tmp/w && for w in /tmp/w/*.whl; do unzip -q -o $w -d /tmp/tf-4.26.1;
done``, then ``PYTHONPATH=/tmp/tf-4.26.1 .venv/bin/python scripts/trace_bloom_loop_rebind.py``. 4.26.1's import-time
check of tokenizers' version is stubbed (no tokenizer runs). fp32, LoRA r=8 on query_key_value written as peft 0.1's
Linear computes it (``F.linear(x, W, b) + lora_B(lora_A(dropout(x))) * scaling``), frozen base, per-tensor AdamW,
``zero_grad(set_to_none=False)`` (the PyTorch 1.13 default); live bytes of real CPU tensors per storage, rounded to the
allocator's 512-byte blocks. One step runs before the measured three, so the states exist at 'begin' as in epoch 15.
"""

from __future__ import annotations

import sys
import types
import weakref
from typing import Any

VOCAB, HIDDEN, HEADS, BATCH, SEQ = 8192, 64, 4, 4, 32


def _import_release() -> Any:
    stub = types.ModuleType("transformers.dependency_versions_check")
    stub.dep_version_check = lambda *args, **kwargs: None  # type: ignore[attr-defined]
    sys.modules["transformers.dependency_versions_check"] = stub
    import transformers

    if transformers.__version__ != "4.26.1":
        raise SystemExit(f"transformers {transformers.__version__}: put the 4.26.1 wheel on PYTHONPATH (see the docstring)")
    return transformers


def max_over_begin(layers: int, delete_outputs: bool) -> tuple[int, str]:
    """Peak live bytes over three steps minus the live bytes before them, and the phase the peak fell in."""
    import torch
    import torch.nn.functional as F
    from torch import nn
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    transformers = _import_release()

    class Lora(nn.Module):
        def __init__(self, base: nn.Linear, r: int = 8, alpha: int = 32) -> None:
            super().__init__()
            self.base = base
            self.lora_A = nn.Linear(base.in_features, r, bias=False)
            self.lora_B = nn.Linear(r, base.out_features, bias=False)
            self.drop = nn.Dropout(0.1)
            self.scaling = alpha / r

        def forward(self, x: Any) -> Any:
            return F.linear(x, self.base.weight, self.base.bias) + self.lora_B(self.lora_A(self.drop(x))) * self.scaling

    class Live(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.seen: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
            self.total = self.peak = 0
            self.phase = self.where = ""

        def _free(self, nbytes: int) -> None:
            self.total -= nbytes

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            out = func(*args, **(kwargs or {}))
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor):
                    storage = t.untyped_storage()
                    if storage not in self.seen:
                        nbytes = -(-storage.nbytes() // 512) * 512
                        self.seen[storage] = nbytes
                        self.total += nbytes
                        weakref.finalize(storage, self._free, nbytes)
            if self.total > self.peak:
                self.peak, self.where = self.total, self.phase
            return out

    torch.manual_seed(0)
    config = transformers.BloomConfig(vocab_size=VOCAB, hidden_size=HIDDEN, n_layer=layers, n_head=HEADS)  # use_cache true
    live = Live()
    with live:
        model = transformers.BloomForCausalLM(config)
        for p in model.parameters():
            p.requires_grad_(False)
        for block in model.transformer.h:
            block.self_attention.query_key_value = Lora(block.self_attention.query_key_value)
        model.train()
        optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=3e-3, foreach=False)
        ids = torch.randint(0, VOCAB, (BATCH, SEQ))
        batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}
        outputs = None
        for step in range(4):
            if step == 1:   # the states exist: this is the epoch's 'begin' (the first step's output deleted)
                del outputs
                outputs = None
                begin, live.peak = live.total, 0
            live.phase = "forward"
            outputs = model(**batch)
            loss = outputs.loss
            live.phase = "backward"
            loss.backward()
            live.phase = "optimizer"
            optimizer.step()
            optimizer.zero_grad(set_to_none=False)
            del loss
            if delete_outputs:
                del outputs
                outputs = None
        return live.peak - begin, live.where


def main() -> None:
    cache_per_block = 2 * BATCH * SEQ * HIDDEN * 4
    print(f"one fp32 logits tensor {BATCH * SEQ * VOCAB * 4} B; returned key + value per block {cache_per_block} B")
    rows = []
    for layers in (2, 4):
        kept, kept_at = max_over_begin(layers, False)
        freed, freed_at = max_over_begin(layers, True)
        rows.append(kept - freed)
        print(f"{layers} blocks: max-begin as written {kept} B (peak in {kept_at}); with 'del outputs' {freed} B "
              f"(peak in {freed_at}); difference {kept - freed} B")
    print(f"difference per block (4 minus 2 blocks, / 2): {(rows[1] - rows[0]) // 2} B")


if __name__ == "__main__":
    main()
