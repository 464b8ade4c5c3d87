"""The tokenizer and model of the decoder pre-training recipe: a named tokenizer or a byte-level BPE one trained on the
training text, a checkpoint that ``AutoModelForCausalLM`` loads (refused early otherwise) or a from-scratch Llama-style
decoder."""

from __future__ import annotations

from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

from robust_pretrain.cli import UsageError
from robust_pretrain.data.bpe import train_bpe_tokenizer
from robust_pretrain.pretraining.causal_lm.arguments import DECODER_SIZES, CausalModelArguments
from robust_pretrain.pretraining.common import named_tokenizer, train_tokenizer_once
from robust_pretrain.trainer.training_args import MinimaxTrainingArguments


def load_tokenizer(
    model_args: CausalModelArguments, training_args: MinimaxTrainingArguments, texts: list[str], checkpoint: str | None
) -> PreTrainedTokenizerFast:
    named = named_tokenizer(model_args.tokenizer_name, model_args.model_name_or_path, checkpoint)
    if named is not None:
        tokenizer, source = named
        if tokenizer.eos_token is None:
            raise UsageError(f"{source}: the tokenizer has no eos token to end each packed text")
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token  # padding is masked out of attention and labels
        return tokenizer
    return train_tokenizer_once(
        training_args, "training the BPE tokenizer", lambda: train_bpe_tokenizer(texts, model_args.vocab_size)
    )


def check_causal_checkpoint(name: str) -> None:
    """Refuse a checkpoint whose architecture AutoModelForCausalLM cannot load, before any data is read."""
    try:
        config = AutoConfig.from_pretrained(name)
    except (OSError, ValueError) as err:
        raise UsageError(f"--model_name_or_path {name}: {err}") from err
    causal_names = set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values())
    architectures = config.architectures or []
    # an encoder family with a decoder head (BERT's BertLMHeadModel) is causal only when its checkpoint is one
    in_mapping = config.model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    encoder = in_mapping and bool(architectures) and not set(architectures) & causal_names and not config.is_decoder
    if not in_mapping or config.is_encoder_decoder or encoder:
        raise UsageError(
            f"--model_name_or_path {name} ({config.model_type}, {', '.join(architectures) or 'no architecture'}) is "
            "not a causal LM; give a decoder checkpoint that AutoModelForCausalLM loads (GPT-2, Llama, Qwen2, ...) or "
            "leave it unset to train one from scratch"
        )


def load_model(model_args: CausalModelArguments, tokenizer: Any, max_seq_length: int) -> torch.nn.Module:
    if model_args.model_name_or_path is not None:
        model = AutoModelForCausalLM.from_pretrained(model_args.model_name_or_path)
        if len(tokenizer) > model.get_input_embeddings().num_embeddings:
            model.resize_token_embeddings(len(tokenizer))
        return model
    layers, hidden, heads, kv_heads, intermediate = DECODER_SIZES[model_args.model_size]
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=max_seq_length,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
    )
    return LlamaForCausalLM(config)
