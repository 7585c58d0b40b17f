"""Write a tiny random WIDE checkpoint: a Hugging Face Llama or Qwen3 folder plus router.pth and lora.pth.

For trying `wide-export --hf-model` without downloads, and for the tests. Keys follow WIDE's naming.

    python -m wide_tvm.tiny_checkpoint OUT_DIR [--kind llama|qwen3]
"""

from __future__ import annotations

import argparse
import json
import os

import torch

SIZES = dict(vocab_size=96, hidden_size=64, intermediate_size=192, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=512)
RANK, ATTN_GROUPS, FFN_GROUPS, LORA_R, LORA_ALPHA = 8, 2, 6, 4, 16.0
QWEN3_HEAD_DIM = 32  # differs from hidden / heads on purpose


def base_config(kind: str):
    """Llama with Llama 3.1's scaled RoPE and an untied head; Qwen3 with q/k norms and tied embeddings."""
    from transformers import LlamaConfig, Qwen3Config

    if kind == "llama":
        return LlamaConfig(**SIZES, rope_theta=500000.0, tie_word_embeddings=False,
                           rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                         "high_freq_factor": 4.0, "original_max_position_embeddings": 64})
    if kind == "qwen3":
        return Qwen3Config(**SIZES, head_dim=QWEN3_HEAD_DIM, tie_word_embeddings=True)
    raise ValueError(f"kind must be llama or qwen3, not {kind!r}")


def random_routers(seed: int, layers: int = SIZES["num_hidden_layers"], groups=(ATTN_GROUPS, FFN_GROUPS),
                   all_execute: bool = False) -> dict[str, torch.Tensor]:
    """router.pth contents; `all_execute` makes every router pick 'execute' (the dense model)."""
    g = torch.Generator().manual_seed(seed)
    hidden, sd = SIZES["hidden_size"], {}
    for i in range(layers):
        for kind, n in zip(("router_attention", "router_ffn"), groups):
            p = f"model.layers.{i}.{kind}"
            sd[f"{p}.compressor.weight"] = torch.randn(RANK, hidden, generator=g)
            sd[f"{p}.compressor.bias"] = torch.randn(RANK, generator=g) * 0.1
            sd[f"{p}.router.weight"] = torch.randn(2 * n, RANK, generator=g) * (0.0 if all_execute else 1.0)
            sd[f"{p}.router.bias"] = torch.tensor([1.0, 0.0] * n) if all_execute else torch.zeros(2 * n)
    return sd


def random_lora(kind: str, seed: int) -> dict[str, torch.Tensor]:
    """lora.pth contents (PEFT key style) for q/v projections and the FFN's up/down projections."""
    g = torch.Generator().manual_seed(seed)
    hidden, inter, heads = SIZES["hidden_size"], SIZES["intermediate_size"], SIZES["num_attention_heads"]
    head_dim = QWEN3_HEAD_DIM if kind == "qwen3" else hidden // heads
    shapes = {"self_attn.q_proj": (heads * head_dim, hidden),
              "self_attn.v_proj": (SIZES["num_key_value_heads"] * head_dim, hidden),
              "mlp.up_proj": (inter, hidden), "mlp.down_proj": (hidden, inter)}
    sd = {}
    for i in range(SIZES["num_hidden_layers"]):
        for mod, (out_f, in_f) in shapes.items():
            p = f"base_model.model.model.layers.{i}.{mod}"
            sd[f"{p}.lora_A.default.weight"] = torch.randn(LORA_R, in_f, generator=g) * 0.2
            sd[f"{p}.lora_B.default.weight"] = torch.randn(out_f, LORA_R, generator=g) * 0.2
    return sd


def write_tiny_checkpoint(folder: str, kind: str = "llama", seed: int = 0) -> str:
    """Save the base model (random weights, norms too) and router.pth / lora.pth into `folder`."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    torch.manual_seed(seed)
    base = AutoModelForCausalLM.from_config(base_config(kind))
    with torch.no_grad():  # norms start at ones; randomise them so a dropped norm weight shows
        for name, p in base.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    base.save_pretrained(folder)
    torch.save(random_routers(10 + seed), os.path.join(folder, "router.pth"))
    torch.save(random_lora(kind, 30 + seed), os.path.join(folder, "lora.pth"))
    write_tiny_tokenizer(folder, SIZES["vocab_size"])
    return folder


CHAT_TEMPLATE = ("{{ bos_token }}{% for m in messages %}{{ m['role'] }}: {{ m['content'] }} {% endfor %}"
                 "{% if add_generation_prompt %}assistant:{% endif %}")


def tiny_words(count: int) -> list[str]:
    """`count` distinct pronounceable words (consonant-vowel-consonant, then longer), for a tiny vocabulary."""
    import itertools

    cons, vows = "bdfgklmnprstvz", "aeiou"
    words = ("".join(w) for n in (3, 5) for w in itertools.product(*([cons, vows] * n)[:n]))
    return list(itertools.islice(words, count))


def write_tiny_tokenizer(folder: str, vocab_size: int = SIZES["vocab_size"]) -> str:
    """A word-level tokenizer of `vocab_size` ids into `folder` (tokenizer.json, tokenizer_config.json with a chat
    template): <s> 0, </s> 1 (end of sequence), <unk> 2, the roles, then words; text splits on spaces."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    special = ["<s>", "</s>", "<unk>", "system:", "user:", "assistant:"]
    vocab = {w: i for i, w in enumerate(special + tiny_words(vocab_size - len(special)))}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # (joins words with spaces)
    tok.add_special_tokens(special[:3])
    os.makedirs(folder, exist_ok=True)
    tok.save(os.path.join(folder, "tokenizer.json"))
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "chat_template": CHAT_TEMPLATE},
                  f, indent=1)
    return folder


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m wide_tvm.tiny_checkpoint", description=__doc__.splitlines()[0])
    p.add_argument("folder")
    p.add_argument("--kind", choices=["llama", "qwen3"], default="llama")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    write_tiny_checkpoint(args.folder, args.kind, args.seed)
    print(f"wrote {args.kind} base model, router.pth and lora.pth (alpha {LORA_ALPHA:g}) to {args.folder}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
