"""Config dicts for bench rows whose model is not in perfguide's offline catalog (remote-code checkpoints).

Each entry is the checkpoint's config.json shape written as the transformers architecture that computes the same
tensors, with the source of every number. ``bench/accuracy.py`` prices a row's ``model_hf_id`` found here from
this dict (``ModelSpec.from_any(dict)``) instead of the catalog.
"""

from __future__ import annotations

from typing import Any

#: Qwen-1 (QWenLMHeadModel, trust_remote_code): c_attn = fused q/k/v with bias, c_proj without bias, RMSNorm,
#: SwiGLU ``c_proj(w1(x) * silu(w2(x)))`` whose two branches are each ``intermediate_size // 2`` wide, rotary
#: positions, untied lm_head. Qwen2 (qwen2 model_type) is the same block (q/k/v bias, no o_proj bias): so the
#: dicts below are Qwen2 configs at Qwen-1's sizes. Sizes: huggingface.co/Qwen/Qwen-{1_8B,7B,14B}/config.json
#: (hidden_size, num_attention_heads, num_hidden_layers, intermediate_size, vocab_size); Qwen-7B's 7.72 B
#: parameters (its model card) come out of the dict below.
_QWEN1 = {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "tie_word_embeddings": False,
          "rms_norm_eps": 1e-6, "max_position_embeddings": 8192, "torch_dtype": "bfloat16"}


def _qwen1(name: str, hidden: int, heads: int, layers: int, intermediate: int, vocab: int) -> dict[str, Any]:
    return {**_QWEN1, "_name_or_path": name, "hidden_size": hidden, "num_attention_heads": heads,
            "num_key_value_heads": heads, "num_hidden_layers": layers, "intermediate_size": intermediate // 2,
            "vocab_size": vocab}


#: CodeLlama 7B (huggingface.co/codellama/CodeLlama-7b-hf/config.json): Llama-2-7B's block (4096 x 32 layers, FFN 11008,
#: 32 heads, no GQA) with vocab 32016, rope_theta 1e6 and 16384 positions (rotary: no memory). The row that trains it
#: (philschmid_finetune_llms_2024) runs trl's setup_chat_format first, which resizes embedding and head to 32018.
_CODELLAMA_7B = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "_name_or_path": "codellama/CodeLlama-7b-hf",
                 "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 32, "num_hidden_layers": 32,
                 "intermediate_size": 11008, "vocab_size": 32018, "rms_norm_eps": 1e-5, "max_position_embeddings": 16384,
                 "rope_theta": 1000000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16"}

#: StarCoderBase-1B (huggingface.co/bigcode/starcoderbase-1b/config.json, GPTBigCodeForCausalLM): 2048 x 24 layers,
#: 16 heads with multi-query attention (one 128-wide key/value head), FFN 8192, vocab 49152, 8192 learned positions,
#: head tied to wte. 1,137,207,296 parameters, as the cookbook notebook's print_trainable_parameters gives them
#: (1,142,761,472 all less 5,554,176 LoRA).
_STARCODERBASE_1B = {"model_type": "gpt_bigcode", "architectures": ["GPTBigCodeForCausalLM"],
                     "_name_or_path": "bigcode/starcoderbase-1b", "n_embd": 2048, "n_head": 16, "n_layer": 24,
                     "n_inner": 8192, "n_positions": 8192, "vocab_size": 49152, "multi_query": True,
                     "activation_function": "gelu_pytorch_tanh", "layer_norm_epsilon": 1e-5, "bos_token_id": 0,
                     "eos_token_id": 0, "tie_word_embeddings": True, "torch_dtype": "float32"}

#: StarCoder 15.5B (huggingface.co/bigcode/starcoder/config.json, GPTBigCodeForCausalLM): StarCoderBase-1B's block at 6144 x
#: 40 layers, 48 heads with multi-query attention (one 128-wide key/value head), FFN 24576, vocab 49152, 8192 learned
#: positions, head tied to wte. 15,517,456,384 parameters come out of the dict below, as the Personal Copilot blog's
#: print_trainable_parameters gives them ('trainable params: 110,428,160 || all params: 15,627,884,544': all less the
#: r=32 LoRA on c_attn, c_proj, c_fc of 40 blocks, 40 x 32 x (12544 + 12288 + 30720 + 30720) = 110,428,160)
_STARCODER = {**_STARCODERBASE_1B, "_name_or_path": "bigcode/starcoder", "n_embd": 6144, "n_head": 48, "n_layer": 40,
              "n_inner": 24576}

#: BLOOMZ-7b1 (huggingface.co/bigscience/bloomz-7b1/config.json, BLOOM-7b1's shape): 4096 x 30 layers, 32 heads, fused
#: query_key_value with bias, 4h GELU MLP, ALiBi (no position table), vocab 250880, head tied to word_embeddings;
#: 7,069,016,064 parameters (BLOOM paper table 1: 7.1B) come out of the dict below.
_BLOOMZ_7B1 = {"model_type": "bloom", "architectures": ["BloomForCausalLM"], "_name_or_path": "bigscience/bloomz-7b1",
               "hidden_size": 4096, "n_layer": 30, "n_head": 32, "vocab_size": 250880, "layer_norm_epsilon": 1e-5,
               "tie_word_embeddings": True, "torch_dtype": "float16"}

#: mT0-xxl (huggingface.co/bigscience/mt0-xxl/config.json, mT5-XXL's shape; google-research/t5x mt5 xxl.gin: emb_dim 4096,
#: 64 heads of 64, 24 + 24 layers, mlp_dim 10240 gated GELU, vocab 250112, logits_via_embedding False: an untied head);
#: 12.92 B parameters (the mT5 paper's 13B) come out of the dict below.
_MT0_XXL = {"model_type": "mt5", "architectures": ["MT5ForConditionalGeneration"], "_name_or_path": "bigscience/mt0-xxl",
            "d_model": 4096, "d_ff": 10240, "d_kv": 64, "num_heads": 64, "num_layers": 24, "num_decoder_layers": 24,
            "vocab_size": 250112, "feed_forward_proj": "gated-gelu", "tie_word_embeddings": False, "torch_dtype": "float32"}

#: DeBERTa-v2-xlarge-mnli (huggingface.co/microsoft/deberta-v2-xlarge-mnli/config.json): 1536 x 24 layers, 24 heads, FFN
#: 6144, vocab 128100, relative attention with 256 position buckets shared with the keys (p2c + c2p), no absolute
#: positions, a conv layer of kernel 3 after the first block; 0.89 B parameters with a 2-label head (the blog's "900M").
_DEBERTA_V2_XLARGE = {"model_type": "deberta-v2", "architectures": ["DebertaV2ForSequenceClassification"],
                      "_name_or_path": "microsoft/deberta-v2-xlarge-mnli", "hidden_size": 1536, "num_hidden_layers": 24,
                      "num_attention_heads": 24, "intermediate_size": 6144, "vocab_size": 128100,
                      "max_position_embeddings": 512, "relative_attention": True, "position_buckets": 256,
                      "pos_att_type": ["p2c", "c2p"], "position_biased_input": False, "share_att_key": True,
                      "norm_rel_ebd": "layer_norm", "max_relative_positions": -1, "conv_kernel_size": 3,
                      "conv_act": "gelu", "type_vocab_size": 0, "hidden_act": "gelu", "torch_dtype": "float32"}

#: BlenderBot-400M-distill (huggingface.co/facebook/blenderbot-400M-distill/config.json): d_model 1280, a 2-layer encoder and
#: a 12-layer decoder, 32 heads, FFN 5120, vocab 8008, 128 learned positions, scaled embeddings shared by both stacks and the
#: head; 364,802,560 parameters come out of the dict below.
_BLENDERBOT_400M = {"model_type": "blenderbot", "architectures": ["BlenderbotForConditionalGeneration"],
                    "_name_or_path": "facebook/blenderbot-400M-distill", "d_model": 1280, "encoder_layers": 2,
                    "decoder_layers": 12, "encoder_attention_heads": 32, "decoder_attention_heads": 32,
                    "encoder_ffn_dim": 5120, "decoder_ffn_dim": 5120, "vocab_size": 8008, "max_position_embeddings": 128,
                    "scale_embedding": True, "activation_function": "gelu", "torch_dtype": "float32"}

#: OpenLLaMA 3B v2 (huggingface.co/openlm-research/open_llama_3b_v2/config.json, LlamaForCausalLM): 3200 x 26 layers,
#: 32 heads of 100 (no GQA), FFN 8640, vocab 32000, untied head, 2048 positions, rms_norm_eps 1e-6: 3,426,473,600
#: parameters (26 x (4 x 3200^2 + 3 x 3200 x 8640 + 2 x 3200) + 2 x 32000 x 3200 + 3200)
_OPEN_LLAMA_3B_V2 = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "_name_or_path": "openlm-research/open_llama_3b_v2",
                     "hidden_size": 3200, "num_attention_heads": 32, "num_key_value_heads": 32, "num_hidden_layers": 26,
                     "intermediate_size": 8640, "vocab_size": 32000, "rms_norm_eps": 1e-6, "max_position_embeddings": 2048,
                     "tie_word_embeddings": False, "torch_dtype": "float16"}

#: SmolLM2-1.7B (huggingface.co/HuggingFaceTB/SmolLM2-1.7B/config.json, LlamaForCausalLM): 2048 x 24 layers, 32 heads
#: without GQA (32 key/value heads), SwiGLU FFN 8192, vocab 49152, head tied to the embedding, 8192 rotary positions (no
#: memory). The config file itself is not in the stored corpora (read from memory of the Hub file, unverified here); the
#: shape gives 1,711,376,384 parameters (49152 x 2048 + 24 x (4 x 2048^2 + 3 x 2048 x 8192) + norms), the "1.7B" of its
#: model card and the 1.71 B of third-party model listings.
_SMOLLM2_1_7B = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "_name_or_path": "HuggingFaceTB/SmolLM2-1.7B",
                 "hidden_size": 2048, "num_attention_heads": 32, "num_key_value_heads": 32, "num_hidden_layers": 24,
                 "intermediate_size": 8192, "vocab_size": 49152, "rms_norm_eps": 1e-5, "max_position_embeddings": 8192,
                 "rope_theta": 130000.0, "tie_word_embeddings": True, "torch_dtype": "bfloat16"}

#: ChatGLM3-6B (ChatGLMForConditionalGeneration, trust_remote_code; huggingface.co/THUDM/chatglm3-6b/blame/d4cd7d0/config.json
#: and chatglm3-6b-32k/blame/main/config.json): RMSNorm, a fused query_key_value with bias (add_qkv_bias) over 32 query
#: heads of kv_channels 128 and multi_query_group_num 2 key/value heads, a dense output without bias (add_bias_linear
#: false), SwiGLU dense_h_to_4h of 2 x ffn_hidden_size 13696, 28 layers of 4096, an untied output_layer over
#: padded_vocab_size 65024, rotary on half of each head (no memory); seq_length 8192 (32768 for the 32k model). A Qwen2
#: config computes the same tensors (q/k/v bias, no o bias, GQA): written so.
_CHATGLM3 = {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "hidden_size": 4096, "num_attention_heads": 32,
             "num_key_value_heads": 2, "head_dim": 128, "num_hidden_layers": 28, "intermediate_size": 13696, "vocab_size": 65024,
             "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "torch_dtype": "float16"}

#: Baichuan2-7B (BaichuanForCausalLM, trust_remote_code): Llama-2-7B's block (4096 x 32 layers, 32 heads, FFN 11008; q/k/v
#: fused in W_pack, no bias) with a 125,696-token vocabulary and an untied NormHead (the same parameter count as a Linear),
#: rotary positions, rms_norm_eps 1e-6; values from a fine-tune's copy naming baichuan-inc/Baichuan2-7B-Chat
#: (huggingface.co/Jianyuan/SFT-baichuan-v2-2000/blob/3858f5f/config.json), written as the Llama config it equals.
_BAICHUAN2_7B = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "_name_or_path": "baichuan-inc/Baichuan2-7B-Chat",
                 "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 32, "num_hidden_layers": 32,
                 "intermediate_size": 11008, "vocab_size": 125696, "rms_norm_eps": 1e-6, "max_position_embeddings": 4096,
                 "tie_word_embeddings": False, "torch_dtype": "bfloat16"}

CONFIGS: dict[str, dict[str, Any]] = {
    "ZhipuAI/chatglm3-6b": {**_CHATGLM3, "_name_or_path": "ZhipuAI/chatglm3-6b", "max_position_embeddings": 8192},
    "ZhipuAI/chatglm3-6b-32k": {**_CHATGLM3, "_name_or_path": "ZhipuAI/chatglm3-6b-32k", "max_position_embeddings": 32768},
    "baichuan-inc/Baichuan2-7B-Chat": _BAICHUAN2_7B,
    "bigscience/bloomz-7b1": _BLOOMZ_7B1,
    "HuggingFaceTB/SmolLM2-1.7B": _SMOLLM2_1_7B,
    "bigscience/mt0-xxl": _MT0_XXL,
    "microsoft/deberta-v2-xlarge-mnli": _DEBERTA_V2_XLARGE,
    "facebook/blenderbot-400M-distill": _BLENDERBOT_400M,
    "bigcode/starcoderbase-1b": _STARCODERBASE_1B,
    "bigcode/starcoder": _STARCODER,
    # OctoCoder is StarCoder instruction-tuned (huggingface.co/bigcode/octocoder: 15.5B, GPTBigCodeForCausalLM), StarCoder's shapes
    "bigcode/octocoder": {**_STARCODER, "_name_or_path": "bigcode/octocoder"},
    "codellama/CodeLlama-7b-hf": _CODELLAMA_7B,
    "openlm-research/open_llama_3b_v2": _OPEN_LLAMA_3B_V2,
    "Qwen/Qwen-1_8B-Chat": _qwen1("Qwen/Qwen-1_8B-Chat", 2048, 16, 24, 11008, 151936),
    "Qwen/Qwen-7B-Chat": _qwen1("Qwen/Qwen-7B-Chat", 4096, 32, 32, 22016, 151936),
    "Qwen/Qwen-14B-Chat": _qwen1("Qwen/Qwen-14B-Chat", 5120, 40, 40, 27392, 152064),
    # the base checkpoints share their chat models' config.json shapes (huggingface.co/Qwen/Qwen-{1_8B,7B,14B}/config.json)
    "Qwen/Qwen-1_8B": _qwen1("Qwen/Qwen-1_8B", 2048, 16, 24, 11008, 151936),
    "Qwen/Qwen-7B": _qwen1("Qwen/Qwen-7B", 4096, 32, 32, 22016, 151936),
    "Qwen/Qwen-14B": _qwen1("Qwen/Qwen-14B", 5120, 40, 40, 27392, 152064),
}
