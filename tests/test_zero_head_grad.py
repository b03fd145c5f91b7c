"""The output head's gradient at the start of backward: vocabulary-sized for an LM head, none for a task head or for
ZeRO-2's bucketed untied head; and ZeRO-1/2's ipg buffers by overlap_comm.

Hand counts: pythia-160m's untied head is 50,304 x 768 = 38,633,472 weights, 77,266,944 B as a 16-bit gradient;
GPT-2's tied head 50,257 x 768 = 38,597,376 (77,194,752 B; the model charges its whole embedding table, wpe too). DeepSpeed's ZeRO-2 hook copies a gradient into the ipg
buffer and frees its own storage (stage_1_and_2.py v0.7.2 ``reduce_independent_p_g_buckets_and_remove_grads``); its
``backward()`` allocates a second buffer only with overlap_comm.
"""

from __future__ import annotations

import pytest
from helpers import load_bench

from perfguide._data import load
from perfguide.memory.analytic import training_memory
from perfguide.memory.zero_runtime import early_head_grad_bytes, ipg_buffers
from perfguide.model.types import ModelSpec
from perfguide.setup import Setup

PYTHIA_HEAD = 50_304 * 768 * 2
GPT2_HEAD = 50_257 * 768 * 2
LOTS = 10**13   # a gradient budget above any head, so the head's own size decides


def _zero(stage: str) -> Setup:
    # batch 4 x 512: activations and loss buffers dwarf the states, so the step peaks before any gradient is reduced
    return Setup(micro_batch_size=4, seq_len=512, strategy=stage, num_gpus=2, weights_dtype="fp32", autocast="fp16")


def test_an_lm_head_holds_its_gradient_a_task_head_none() -> None:
    lm = ModelSpec.from_any("EleutherAI/pythia-160m")
    single = Setup(micro_batch_size=4, seq_len=128, weights_dtype="bf16")
    assert early_head_grad_bytes(lm, single, LOTS, 2) == PYTHIA_HEAD
    for head in ("sequence_classification", "token_classification", "question_answering", "base"):
        task = lm.model_copy(update={"head": head, "num_labels": 2})
        assert early_head_grad_bytes(task, single, LOTS, 2) == 0, head
    assert early_head_grad_bytes(lm, single, 1000, 2) == 1000   # never more than the gradients there are


def test_zero2_moves_an_untied_head_into_the_bucket_zero1_and_a_tied_head_keep_it() -> None:
    pythia, gpt2 = ModelSpec.from_any("EleutherAI/pythia-160m"), ModelSpec.from_any("openai-community/gpt2")
    assert early_head_grad_bytes(pythia, _zero("zero2"), LOTS, 2) == 0
    assert early_head_grad_bytes(pythia, _zero("zero1"), LOTS, 2) == PYTHIA_HEAD
    # a tied head waits for the embedding's share: ZeRO-2 holds what ZeRO-1 holds (at least the 50,257 x 768 table)
    tied = early_head_grad_bytes(gpt2, _zero("zero2"), LOTS, 2)
    assert tied == early_head_grad_bytes(gpt2, _zero("zero1"), LOTS, 2) >= GPT2_HEAD
    assert early_head_grad_bytes(pythia, _zero("zero3"), LOTS, 2) == PYTHIA_HEAD   # ZeRO-3: as before


def test_a_head_larger_than_the_bucket_is_reduced_from_its_own_grad(monkeypatch: pytest.MonkeyPatch) -> None:
    pythia = ModelSpec.from_any("EleutherAI/pythia-160m")
    monkeypatch.setitem(load("calibration")["deepspeed_bucket_elements"], "value", 38_633_471)   # one element short
    assert early_head_grad_bytes(pythia, _zero("zero2"), LOTS, 2) == PYTHIA_HEAD


def test_the_step_peak_drops_by_the_head_gradient_under_zero2() -> None:
    pythia, gpt2 = ModelSpec.from_any("EleutherAI/pythia-160m"), ModelSpec.from_any("openai-community/gpt2")
    one, two = training_memory(pythia, _zero("zero1")), training_memory(pythia, _zero("zero2"))
    # the loss peak and the start of backward both hold the head's gradient beside every saved activation
    assert one.notes[0] == two.notes[0] and one.notes[0] in ("peak in forward/loss", "peak in checkpoint recompute")
    # ZeRO-1 and ZeRO-2 hold the same weights, optimizer shard and ipg buffers there; only the head's gradient differs
    assert one.peak_allocated - two.peak_allocated == PYTHIA_HEAD
    tied_one, tied_two = training_memory(gpt2, _zero("zero1")), training_memory(gpt2, _zero("zero2"))
    assert tied_one.peak_allocated == tied_two.peak_allocated


def test_ipg_buffers_follow_overlap_comm() -> None:
    assert ipg_buffers(True) == 2 and ipg_buffers(False) == 1
    assert Setup().overlap_comm is True   # perfguide's configs (and the transformers ZeRO templates) set it


def test_overlap_comm_false_holds_one_bucket_and_the_bench_reads_it_from_the_row() -> None:
    spec = ModelSpec.from_any("google-t5/t5-large")
    # batch 8 x 128: the loss buffers stay small, so the step peaks as backward starts, beside the ipg buffers
    setup = Setup(micro_batch_size=8, seq_len=128, strategy="zero2", num_gpus=2, weights_dtype="fp32", autocast="fp16",
                  attn_implementation="eager")
    two, one = training_memory(spec, setup), training_memory(spec, setup.replace(overlap_comm=False))
    assert one.notes[0] == two.notes[0] == "peak in checkpoint recompute"   # the start of backward
    # T5-large trains more than 5e8 weights: each buffer is 5e8 fp16 elements, 1e9 B
    assert two.peak_allocated - one.peak_allocated == 500_000_000 * 2
    read = load_bench("accuracy_setup")._strategy
    row = {"parallelism": "DeepSpeed ZeRO-2 (no CPU offload)", "num_gpus": "2",
           "notes": "DeepSpeed's defaults run: reduce_bucket_size 5e8, overlap_comm false, contiguous_gradients true"}
    assert read(row)["overlap_comm"] is False
    assert read({**row, "notes": "zero2_config_accelerate.json: overlap_comm true"})["overlap_comm"] is True
    assert read({**row, "notes": "no knob stated"})["overlap_comm"] is True   # unstated: perfguide's own


def _grad_order(model: object, **batch: object) -> list[str]:
    """Parameter names in the order autograd lands their gradients in ``.grad`` (real CPU tensors)."""
    import torch

    order: list[str] = []
    assert isinstance(model, torch.nn.Module)
    for name, p in model.named_parameters():
        p.register_post_accumulate_grad_hook(lambda _p, name=name: order.append(name))
    model(**batch).loss.backward()
    return order


def test_a_classifier_gets_its_embedding_gradient_last_an_lm_its_head_gradient_first() -> None:
    """Why a task head holds no vocabulary-sized gradient as backward starts: on a real BERT classifier the token
    table's gradient is the last to land; on an untied LM (GPT-NeoX, pythia's layout) the head's is the first."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification, GPTNeoXConfig, GPTNeoXForCausalLM

    torch.manual_seed(0)
    ids = torch.randint(0, 500, (2, 16))
    bert = BertForSequenceClassification(BertConfig(vocab_size=500, hidden_size=64, num_hidden_layers=2,
                                                    num_attention_heads=2, intermediate_size=128, num_labels=2))
    order = _grad_order(bert, input_ids=ids, labels=torch.tensor([0, 1]))
    assert order[0].startswith("classifier.") and order[-1] == "bert.embeddings.word_embeddings.weight"
    neox = GPTNeoXForCausalLM(GPTNeoXConfig(vocab_size=500, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                                            intermediate_size=128, tie_word_embeddings=False))
    order = _grad_order(neox, input_ids=ids, labels=ids)
    assert order[0] == "lm_head.weight" and order[-1] == "gpt_neox.embed_in.weight"


def test_ipg_buffers_hold_the_whole_bucket_however_few_gradients_train() -> None:
    """``torch.empty(int(self.reduce_bucket_size))`` per buffer: LoRA's few adapter gradients still get two 5e8-element
    fp16 buffers (2,000,000,000 B) under perfguide's ZeRO-2 config, as many as full fine-tuning of a larger model."""
    from perfguide.memory.sharding import bucket_bytes

    lora = Setup(micro_batch_size=1, seq_len=512, strategy="zero2", num_gpus=2, weights_dtype="bf16",
                 lora={"r": 8, "alpha": 16})
    assert bucket_bytes(lora, 4_194_304, 2) == 2 * 500_000_000 * 2
    assert bucket_bytes(lora.replace(lora=None), 124_439_808, 2) == 2 * 500_000_000 * 2
