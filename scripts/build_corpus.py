"""Regenerate the embedded UD English-EWT paragraph corpus in robust_pretrain/data/resources/.

Usage: python scripts/build_corpus.py [--ud-dir ../shared/data/ud_ewt]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from robust_pretrain.data.conllu import read_conllu
from robust_pretrain.data.corpus import CORPUS_FILES, paragraphs, write_corpus

REPO_ROOT = Path(__file__).resolve().parents[1]
SPLIT_SOURCES = {"train": ("train", "dev"), "test": ("test",)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ud-dir", type=Path, default=REPO_ROOT.parent / "shared" / "data" / "ud_ewt")
    args = parser.parse_args()
    for split, sources in SPLIT_SOURCES.items():
        texts = []
        for source in sources:
            texts.extend(paragraphs(read_conllu(args.ud_dir / f"en_ewt-ud-{source}.conllu")))
        write_corpus(texts, CORPUS_FILES[split])
        size = CORPUS_FILES[split].stat().st_size / 1e6
        print(f"{split}: {len(texts)} paragraphs, {sum(len(t.split()) for t in texts)} whitespace words, {size:.2f} MB")


if __name__ == "__main__":
    main()
