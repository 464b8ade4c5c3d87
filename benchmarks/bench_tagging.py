"""Tagging throughput and accuracy: the shipped vectorised UPOS perceptron against NLTK's ``pos_tag``.

Same process, one core (numpy/torch threads pinned to 1), rounds interleaved so machine noise hits every backend
alike; the median words/s over rounds is reported. The shipped decoder caches per-word-type scores across calls, so
it is measured twice:

- ``cold``: a fresh tagger each round (model loaded before the clock starts), one first pass over the text: what a
  user tagging a corpus once gets;
- ``warm``: a second pass over the same text with the same tagger (every word type already cached).

NLTK's tagger has no such cache (cold = warm). Backends: ``shipped`` (what the pipeline uses),
``shipped-pure-python`` (the same weights decoded one word at a time by NLTK's ``AveragedPerceptron.predict``, the
accuracy reference), ``nltk.pos_tag`` (NLTK's standard English model, Penn tags mapped to UPOS for accuracy).
Inputs: gold EWT test words (tagging only; gives accuracy), EWT test raw sentence text, and the UD English-EWT
train+dev paragraphs (raw text, a larger corpus); raw text includes word tokenisation (our tokenizer for both).

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
from functools import partial
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import nltk  # noqa: E402

from robust_pretrain.data.conllu import read_conllu, upos_accuracy  # noqa: E402
from robust_pretrain.data.corpus import load_ewt_corpus, resolve_ud_dir  # noqa: E402
from robust_pretrain.data.perceptron import VectorizedPerceptron, load_model, reference_tagger  # noqa: E402
from robust_pretrain.data.taggers import SHIPPED_MODEL_PATH, ShippedTagger, _loaded_models, penn_to_upos  # noqa: E402
from robust_pretrain.data.word_tokenizer import word_tokenize  # noqa: E402

RESULTS = Path(__file__).with_name("results")


def fresh_shipped_tagger() -> ShippedTagger:
    """A ShippedTagger with a newly built decoder (empty per-type cache), loaded outside any timing."""
    _loaded_models.clear()
    tagger = ShippedTagger()
    _ = tagger.model
    return tagger


def timed(run: Callable[[], object]) -> float:
    started = time.perf_counter()
    run()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ud-dir", type=Path, default=None, help="UD English-EWT folder (default ../shared/...)")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    ud_dir = resolve_ud_dir(args.ud_dir)
    sentences = list(read_conllu(ud_dir / "en_ewt-ud-test.conllu"))
    inputs = {
        "EWT test, gold words": [s.words for s in sentences],
        "EWT test, raw text": [s.text for s in sentences],
        "EWT train+dev paragraphs, raw text": list(load_ewt_corpus("train", ud_dir)["text"]),
    }
    n_words = {
        name: sum(len(x) if isinstance(x, list) else len(word_tokenize(x)) for x in items)
        for name, items in inputs.items()
    }
    gold_words = inputs["EWT test, gold words"]

    started = time.perf_counter()
    model = load_model(SHIPPED_MODEL_PATH)
    decoder = VectorizedPerceptron(model)
    load_seconds = time.perf_counter() - started
    plain = reference_tagger(model)
    nltk.pos_tag(["warm", "up"])  # loads NLTK's model outside the timings

    def tag_shipped(name: str, tagger: ShippedTagger) -> object:
        items = inputs[name]
        return tagger.tag_words(items) if name.endswith("gold words") else tagger(items)

    def tag_nltk(name: str) -> object:
        items = inputs[name]
        if name.endswith("gold words"):
            return [nltk.pos_tag(words) for words in items]
        return [nltk.pos_tag(word_tokenize(text)) for text in items]

    timings: dict[tuple[str, str, str], list[float]] = {}
    for _ in range(args.repeats):  # interleaved rounds
        for name in inputs:
            tagger = fresh_shipped_tagger()
            for cache in ("cold", "warm"):
                timings.setdefault(("shipped", name, cache), []).append(timed(partial(tag_shipped, name, tagger)))
            timings.setdefault(("nltk.pos_tag", name, "-"), []).append(timed(partial(tag_nltk, name)))
        timings.setdefault(("shipped-pure-python", "EWT test, gold words", "-"), []).append(
            timed(lambda: [plain(words) for words in gold_words])
        )

    accuracies = {
        "shipped": upos_accuracy(decoder.tag(gold_words), sentences),
        "shipped-pure-python": upos_accuracy([plain(words) for words in gold_words], sentences),
        "nltk.pos_tag": upos_accuracy([[penn_to_upos(t) for _, t in nltk.pos_tag(w)] for w in gold_words], sentences),
    }
    rows = [
        {
            "backend": backend,
            "input": name,
            "cache": cache,
            "words": n_words[name],
            "median_words_per_s": n_words[name] / statistics.median(seconds),
            "seconds": seconds,
        }
        for (backend, name, cache), seconds in timings.items()
    ]
    speed = {(r["backend"], r["input"], r["cache"]): r["median_words_per_s"] for r in rows}
    ratios = {
        f"{cache}, {name}": speed[("shipped", name, cache)] / speed[("nltk.pos_tag", name, "-")]
        for cache in ("cold", "warm")
        for name in inputs
    }
    gold = "EWT test, gold words"
    ratios[f"pure-python decoding of the shipped model, {gold}"] = (
        speed[("shipped-pure-python", gold, "-")] / speed[("nltk.pos_tag", gold, "-")]
    )
    setup = {
        "repeats": args.repeats,
        "threads": 1,
        "python": platform.python_version(),
        "nltk": nltk.__version__,
        "model": SHIPPED_MODEL_PATH.name,
        "model_load_seconds": round(load_seconds, 2),
        "load_average_1min": round(os.getloadavg()[0], 2),
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "tagging.json").write_text(
        json.dumps(
            {"setup": setup, "rows": rows, "speedup_vs_nltk": ratios, "upos_accuracy_ewt_test": accuracies}, indent=2
        )
        + "\n"
    )
    lines = [
        f"Setup: {json.dumps(setup)}",
        "",
        "cold: fresh tagger, first pass over the text (model loaded before timing); warm: second pass.",
        "",
        "| backend | input | cache | words | median words/s |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['backend']} | {r['input']} | {r['cache']} | {r['words']} | {r['median_words_per_s']:,.0f} |"
        for r in rows
    ]
    lines += ["", "| speed-up of shipped over nltk.pos_tag | ratio |", "|---|---|"]
    lines += [f"| {name} | {ratio:.1f}x |" for name, ratio in ratios.items()]
    lines += ["", "| backend | UPOS accuracy, EWT test (gold words) |", "|---|---|"]
    lines += [f"| {name} | {acc:.4f} |" for name, acc in accuracies.items()]
    (RESULTS / "tagging.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
