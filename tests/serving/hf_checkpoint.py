"""A small random Llama checkpoint in Hugging Face layout with a byte-level tokenizer, made here (no download):
what transformers, lm-eval's ``hf`` model and its tokenizer-driven clients load like any hub checkpoint."""

from __future__ import annotations

from pathlib import Path

import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

EOS = "<|endoftext|>"
VOCAB = 257  # the 256 bytes, then EOS


def byte_tokenizer() -> transformers.PreTrainedTokenizerFast:
    """GPT-2's byte-level alphabet with no merges: one token per byte, so any text encodes."""
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    byte_map = _bytes_to_unicode()
    vocab = {byte_map[b]: b for b in range(256)}
    assert set(vocab) == set(alphabet)
    vocab[EOS] = 256
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([EOS])
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=EOS)


def _bytes_to_unicode() -> dict[int, str]:
    # GPT-2's table: printable bytes map to themselves, the rest to code points from 256 up.
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs), strict=True))


def save_checkpoint(path: Path, seed: int = 0) -> transformers.LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                                   initializer_range=0.2, bos_token_id=None, eos_token_id=256, pad_token_id=256,
                                   tie_word_embeddings=False)
    model = transformers.LlamaForCausalLM(cfg).eval()
    model.save_pretrained(path)
    byte_tokenizer().save_pretrained(path)
    return model
