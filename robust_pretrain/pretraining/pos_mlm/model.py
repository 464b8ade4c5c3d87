"""The tokenizer and model of the PoS-MLM pre-training recipe: a named or freshly trained WordPiece tokenizer, a
checkpoint's masked LM (optionally with LoRA adapters) or a from-scratch BERT, and the merged LoRA save."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForMaskedLM, BertConfig, BertForMaskedLM, BertTokenizerFast

from robust_pretrain.cli import UsageError
from robust_pretrain.pretraining.common import named_tokenizer, train_tokenizer_once
from robust_pretrain.pretraining.pos_mlm.arguments import MODEL_SIZES, ModelArguments
from robust_pretrain.task_losses import mlm_head_name
from robust_pretrain.trainer.training_args import MinimaxTrainingArguments

logger = logging.getLogger(__name__)


def train_wordpiece_tokenizer(texts: list[str], vocab_size: int) -> BertTokenizerFast:
    """An uncased BERT WordPiece tokenizer trained on ``texts``, the same for the same texts in every run.

    The ``tokenizers`` trainer numbers the word-continuation pieces (``##x``) in hash-map order, which differs between
    runs and breaks ties between equally frequent merges differently (huggingface/tokenizers#1794). Listing every
    ``##x`` of the texts up front, sorted, fixes their numbering and so the whole vocabulary.
    """
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    special = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    started = time.monotonic()
    logger.info("Training a WordPiece tokenizer (vocab_size %d) on %d texts", vocab_size, len(texts))
    continuations: set[str] = set()
    for text in texts:
        for word, _ in tokenizer.pre_tokenizer.pre_tokenize_str(tokenizer.normalizer.normalize_str(text)):
            continuations.update(word[1:])
    pieces = [f"##{char}" for char in sorted(continuations)]
    trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=special + pieces, show_progress=True)
    tokenizer.train_from_iterator(texts, trainer, length=len(texts))
    # the pieces were listed as special tokens only to fix their ids: rebuild with the vocabulary, 5 special tokens
    trained = Tokenizer(models.WordPiece(tokenizer.get_vocab(with_added_tokens=False), unk_token="[UNK]"))
    trained.normalizer, trained.pre_tokenizer = tokenizer.normalizer, tokenizer.pre_tokenizer
    trained.decoder = decoders.WordPiece()
    trained.add_special_tokens(special)
    cls_id, sep_id = trained.token_to_id("[CLS]"), trained.token_to_id("[SEP]")
    trained.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)],
    )
    logger.info("Trained the tokenizer (%d tokens) in %.1f s", trained.get_vocab_size(), time.monotonic() - started)
    return BertTokenizerFast(tokenizer_object=trained, model_max_length=512)


def load_tokenizer(
    model_args: ModelArguments, training_args: MinimaxTrainingArguments, texts: list[str], checkpoint: str | None
):
    named = named_tokenizer(model_args.tokenizer_name, model_args.model_name_or_path, checkpoint)
    if named is not None:
        tokenizer, source = named
        if not tokenizer.is_fast:
            raise UsageError(f"{source} has no fast tokenizer; PoS alignment needs character offsets")
        return tokenizer
    return train_tokenizer_once(
        training_args,
        "training the WordPiece tokenizer",
        lambda: train_wordpiece_tokenizer(texts, model_args.vocab_size),
    )


def load_model(model_args: ModelArguments, tokenizer, max_seq_length: int):
    if model_args.model_name_or_path is None:
        layers, hidden, heads, intermediate = MODEL_SIZES[model_args.model_size]
        config = BertConfig(
            vocab_size=len(tokenizer),
            hidden_size=hidden,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            intermediate_size=intermediate,
            max_position_embeddings=max(512, max_seq_length),
            pad_token_id=tokenizer.pad_token_id,
        )
        model = BertForMaskedLM(config)
        fresh_head = False
    else:
        try:
            config = AutoConfig.from_pretrained(model_args.model_name_or_path)
        except OSError as err:
            raise UsageError(f"--model_name_or_path {model_args.model_name_or_path}: {err}") from err
        positions = getattr(config, "max_position_embeddings", None)
        if positions is not None and max_seq_length > positions:
            raise UsageError(
                f"--max_seq_length {max_seq_length} exceeds the {positions} positions of --model_name_or_path "
                f"{model_args.model_name_or_path}; use at most {positions}"
            )
        try:
            model, loading = AutoModelForMaskedLM.from_pretrained(
                model_args.model_name_or_path, output_loading_info=True
            )
        except ValueError as error:
            raise UsageError(
                f"--model_name_or_path {model_args.model_name_or_path} ({config.model_type}) has no masked-LM head "
                "that AutoModelForMaskedLM can load"
            ) from error
        head = mlm_head_name(model)
        fresh_head = head is not None and any(key.startswith(f"{head}.") for key in loading["missing_keys"])
        if fresh_head:
            logger.info(
                "%s has no masked-LM head: the '%s' weights reported missing above start from random values and are "
                "trained by this run (expected for an encoder such as a sentence-embedding model)",
                model_args.model_name_or_path,
                head,
            )
        if len(tokenizer) > model.get_input_embeddings().num_embeddings:
            model.resize_token_embeddings(len(tokenizer))
    if model_args.use_lora:
        from peft import LoraConfig, get_peft_model

        if model_args.model_name_or_path is None:
            raise UsageError("--use_lora: LoRA adapts a pretrained checkpoint; give --model_name_or_path")
        # A checkpoint without an MLM head (e.g. a sentence encoder) gets a fresh random head: train it and save it
        # with the adapter, or base + adapter would not reproduce the trained masked LM.
        lora = LoraConfig(
            r=model_args.lora_r,
            lora_alpha=model_args.lora_alpha,
            lora_dropout=model_args.lora_dropout,
            target_modules=model_args.lora_target_modules,
            modules_to_save=[mlm_head_name(model)] if fresh_head else None,
        )
        model = get_peft_model(model, lora)
    return model


def save_merged(model, tokenizer, directory: Path) -> None:
    """Save the base model with its LoRA adapters merged in (and the tokenizer) into ``directory``."""
    merged = model.merge_and_unload()
    if not merged.config.tie_word_embeddings:
        # A trained head is no longer tied to the embeddings, and then transformers re-ties no parameter at load: a
        # parameter shared inside the model (BERT's decoder.bias = predictions.bias) must be saved under every
        # name, or it loads freshly initialised.
        seen = set()
        for name, param in list(merged.named_parameters(remove_duplicate=False)):
            if id(param) in seen:
                module, _, leaf = name.rpartition(".")
                setattr(merged.get_submodule(module), leaf, torch.nn.Parameter(param.detach().clone()))
            seen.add(id(param))
    merged.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
