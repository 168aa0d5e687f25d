#!/usr/bin/env python3
"""Build a tiny random-weight Llama checkpoint that SGLang can load.

Usage: python make_tiny_model.py OUT_DIR [--seed 0]

- Architecture: LlamaForCausalLM, 2 layers, hidden 128, 2 heads, vocab 32000,
  tied embeddings, float32 safetensors (~17 MB).
- Tokenizer: the 32k SentencePiece model shipped inside the ``mistral_common``
  wheel (data/tokenizer.model.v1, Llama-2-style), wrapped as a LlamaTokenizer
  and converted to a fast tokenizer.json; a minimal chat template is added.
No network access (no model hub) is needed.
"""

import argparse
import json
import os
import shutil

import torch

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for m in messages %}"
    "{{ '<|' + m['role'] + '|>\n' + m['content'] + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out_dir")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    d = args.out_dir
    os.makedirs(d, exist_ok=True)

    import mistral_common
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    spm = os.path.join(os.path.dirname(mistral_common.__file__), "data", "tokenizer.model.v1")
    shutil.copyfile(spm, os.path.join(d, "tokenizer.model"))
    tok_cfg = {
        "tokenizer_class": "LlamaTokenizer",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "add_bos_token": False,  # the chat template adds it
        "add_eos_token": False,
        "legacy": False,
        "model_max_length": 4096,
        "chat_template": CHAT_TEMPLATE,
    }
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump(tok_cfg, f, indent=2)
    with open(os.path.join(d, "special_tokens_map.json"), "w") as f:
        json.dump({"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}, f, indent=2)

    tok = AutoTokenizer.from_pretrained(d)
    tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(d)  # writes tokenizer.json (fast tokenizer)

    torch.manual_seed(args.seed)
    cfg = LlamaConfig(
        vocab_size=32000,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        tie_word_embeddings=True,
        torch_dtype="float32",
    )
    model = LlamaForCausalLM(cfg)
    model.save_pretrained(d, safe_serialization=True)
    print("tiny model written to", d, "| params:", sum(p.numel() for p in model.parameters()))
    print("vocab", tok.vocab_size, "| sample ids:", tok("Hello world").input_ids)


if __name__ == "__main__":
    main()
