"""Tagging throughput and accuracy: the shipped vectorised UPOS perceptron against NLTK's ``pos_tag``.

Same process, one core (numpy/torch threads pinned to 1), same EWT test text; repeats interleaved so machine noise hits
every backend alike; the median words/s is reported. Three tagger configurations:

- ``shipped``: the shipped model, vectorised batch decoding (what the pipeline uses);
- ``shipped-pure-python``: the same weights decoded one word at a time by NLTK's ``AveragedPerceptron.predict``
  (the "plain perceptron": its accuracy is the reference the vectorised decoder must not drop below);
- ``nltk.pos_tag``: NLTK's standard English model (Penn tags, mapped to UPOS for accuracy).

Two inputs: gold EWT words (tagging only; also gives accuracy) and raw sentence text (word tokenisation + tagging).

    NLTK_DATA=../shared/data/nltk_data python benchmarks/bench_tagging.py   # writes benchmarks/results/tagging.*
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import nltk  # noqa: E402

from robust_pretrain.data.conllu import read_conllu, upos_accuracy  # noqa: E402
from robust_pretrain.data.perceptron import load_model, reference_tagger  # noqa: E402
from robust_pretrain.data.taggers import SHIPPED_MODEL_PATH, ShippedTagger, penn_to_upos  # noqa: E402
from robust_pretrain.data.word_tokenizer import word_tokenize  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).with_name("results")


def median_words_per_second(run: Callable[[], object], n_words: int, repeats: int) -> tuple[float, list[float]]:
    seconds = []
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        seconds.append(time.perf_counter() - started)
    return n_words / statistics.median(seconds), seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ud-dir", type=Path, default=REPO_ROOT.parent / "shared" / "data" / "ud_ewt")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    sentences = list(read_conllu(args.ud_dir / "en_ewt-ud-test.conllu"))
    gold_words = [s.words for s in sentences]
    texts = [s.text for s in sentences]
    n_gold = sum(len(w) for w in gold_words)
    n_raw = sum(len(word_tokenize(t)) for t in texts)

    shipped = ShippedTagger()
    plain = reference_tagger(load_model(SHIPPED_MODEL_PATH))
    shipped.tag_words(gold_words[:10])  # load the model outside the timings
    nltk.pos_tag(["warm", "up"])

    backends: dict[str, dict[str, Callable[[], list]]] = {
        "shipped": {
            "gold words": lambda: shipped.tag_words(gold_words),
            "raw text": lambda: shipped(texts),
        },
        "shipped-pure-python": {"gold words": lambda: [plain(words) for words in gold_words]},
        "nltk.pos_tag": {
            "gold words": lambda: [nltk.pos_tag(words) for words in gold_words],
            "raw text": lambda: [nltk.pos_tag(word_tokenize(text)) for text in texts],
        },
    }
    timings: dict[tuple[str, str], list[float]] = {}
    for _ in range(args.repeats):  # interleaved rounds
        for backend, runs in backends.items():
            for name, run in runs.items():
                n_words = n_gold if name == "gold words" else n_raw
                _, seconds = median_words_per_second(run, n_words, 1)
                timings.setdefault((backend, name), []).extend(seconds)

    accuracies = {
        "shipped": upos_accuracy(shipped.tag_words(gold_words), sentences),
        "shipped-pure-python": upos_accuracy([plain(words) for words in gold_words], sentences),
        "nltk.pos_tag": upos_accuracy([[penn_to_upos(t) for _, t in nltk.pos_tag(w)] for w in gold_words], sentences),
    }
    rows = []
    for (backend, name), seconds in timings.items():
        n_words = n_gold if name == "gold words" else n_raw
        rows.append({"backend": backend, "input": name, "words": n_words,
                     "median_words_per_s": n_words / statistics.median(seconds), "seconds": seconds})
    speed = {(r["backend"], r["input"]): r["median_words_per_s"] for r in rows}
    ratios = {name: speed[("shipped", name)] / speed[("nltk.pos_tag", name)] for name in ("gold words", "raw text")}
    ratios["vectorised vs pure-python decoding (same weights)"] = (
        speed[("shipped", "gold words")] / speed[("shipped-pure-python", "gold words")]
    )
    setup = {"text": "UD English-EWT test (2077 sentences)", "repeats": args.repeats, "threads": 1,
             "python": platform.python_version(), "nltk": nltk.__version__, "model": SHIPPED_MODEL_PATH.name,
             "load_average_1min": round(os.getloadavg()[0], 2)}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "tagging.json").write_text(json.dumps(
        {"setup": setup, "rows": rows, "speedup_vs_nltk": ratios, "upos_accuracy_ewt_test": accuracies}, indent=2
    ) + "\n")
    lines = [f"Setup: {json.dumps(setup)}", "", "| backend | input | words | median words/s |", "|---|---|---|---|"]
    lines += [f"| {r['backend']} | {r['input']} | {r['words']} | {r['median_words_per_s']:,.0f} |" for r in rows]
    lines += ["", "| speed-up of shipped | ratio |", "|---|---|"]
    lines += [f"| {name} | {ratio:.1f}x |" for name, ratio in ratios.items()]
    lines += ["", "| backend | UPOS accuracy, EWT test (gold words) |", "|---|---|"]
    lines += [f"| {name} | {acc:.4f} |" for name, acc in accuracies.items()]
    (RESULTS / "tagging.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
