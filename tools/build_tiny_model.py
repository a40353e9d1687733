"""Build a tiny random-weight Llama (and its tokenizer) that real vLLM can serve on a CPU.

Why: no model hub is reachable here, and the harness needs a real ``vllm serve`` whose
scheduler, KV pool and /metrics behave as in production; the model's quality is irrelevant
(clients send ``ignore_eos`` so ``max_tokens`` fixes output lengths).

Steps:
  1. Train a byte-level BPE (``tokenizers``) with VOCAB_SIZE tokens on local text: the
     Python standard library's own sources (always present, deterministic for a given
     Python). Special tokens: <pad> <s> </s> <|user|> <|assistant|> <|system|>.
  2. Wrap it in ``PreTrainedTokenizerFast`` with a minimal chat template.
  3. ``LlamaConfig``: hidden 128, intermediate 256, 2 layers, 4 heads, 2 KV heads,
     4096 positions, tied embeddings; weights from ``torch.manual_seed(SEED)``.
  4. ``save_pretrained`` both into --out (safetensors). About 3.5 MB, ~10 s.
Runs with the vLLM venv's python (needs torch, transformers, tokenizers).
"""

from __future__ import annotations

import argparse
import sysconfig
from collections.abc import Iterator
from pathlib import Path

VOCAB_SIZE = 4096
SEED = 0
SPECIAL_TOKENS = ["<pad>", "<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>"]
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{{ eos_token }}"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
MAX_TRAINING_FILES = 400


def stdlib_texts() -> Iterator[str]:
    """Yield the stdlib's .py sources in sorted order, so training is repeatable."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.glob("*.py"))[:MAX_TRAINING_FILES]
    for path in files:
        yield path.read_text(encoding="utf-8", errors="replace")


def build_tokenizer(out: Path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(stdlib_texts(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
        model_max_length=4096,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    return fast


def build_model(out: Path, tokenizer) -> int:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(SEED)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        torch_dtype="float32",
    )
    model = LlamaForCausalLM(config)
    model.save_pretrained(out, safe_serialization=True)
    return sum(p.numel() for p in model.parameters())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="output folder")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(args.out)
    n_params = build_model(args.out, tokenizer)
    print(f"tiny model: {n_params} parameters, vocab {len(tokenizer)}, saved to {args.out}")


if __name__ == "__main__":
    main()
