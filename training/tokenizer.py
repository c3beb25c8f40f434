"""The tiny policy's tokenizer: one id per word of `envsim.prompts.COMPACT_VOCAB`.

A word-level vocabulary of ~30 tokens keeps the embedding table negligible and makes every token a
whole concept (a digit, a cell, an action), which is what lets a model of a few million parameters
learn the task from scratch. Text given to it is the space-joined `compact_tokens` form; decoded
completions (`Agent 0 : R D <nl> Agent 1 : U`) are plans to `envsim.parser`, which reads `<nl>` as a
line break.
"""

from __future__ import annotations

from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import WhitespaceSplit
from transformers import PreTrainedTokenizerFast

from envsim.prompts import COMPACT_VOCAB, compact_tokens

PAD, UNK, EOS = "<pad>", "<unk>", "<eos>"


def build_tokenizer() -> PreTrainedTokenizerFast:
    """A fresh tokenizer over `COMPACT_VOCAB` (ids follow the vocabulary order: `<pad>` is 0)."""
    vocab = {word: i for i, word in enumerate(COMPACT_VOCAB)}
    core = Tokenizer(WordLevel(vocab, unk_token=UNK))
    core.pre_tokenizer = WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token=PAD, unk_token=UNK, eos_token=EOS,
                                   padding_side="left", model_max_length=1024)


def is_compact(tokenizer) -> bool:
    """True when `tokenizer` is (a copy of) the envlab compact tokenizer: the same words at the same ids."""
    vocab = tokenizer.get_vocab()
    return len(vocab) == len(COMPACT_VOCAB) and all(vocab.get(w) == i for i, w in enumerate(COMPACT_VOCAB))


def compact_text(text: str) -> str:
    """Any compact prompt or answer as the space-joined token line the tokenizer reads."""
    return " ".join(compact_tokens(text))
