"""The tokenizer a decoder trained from scratch gets: byte-level BPE trained on its training text."""

from __future__ import annotations

from collections.abc import Sequence

from transformers import PreTrainedTokenizerFast

#: the special tokens of :func:`train_bpe_tokenizer` (``</s>`` ends each packed text)
SPECIAL_TOKENS = {"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>", "unk_token": "<unk>"}


def train_bpe_tokenizer(texts: Sequence[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer (GPT-2 style: any text encodes, none is unknown) trained on ``texts``, with
    ``<s>``, ``</s>`` (end of text), ``<pad>`` and ``<unk>``; deterministic for the same texts."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS.values()),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer, length=len(texts))
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, model_max_length=8192, **SPECIAL_TOKENS)


__all__ = ["SPECIAL_TOKENS", "train_bpe_tokenizer"]
