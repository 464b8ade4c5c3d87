"""The data of the rare-domains experiment (``scripts/rare_domains_protocol.md``), written at run time from
``../shared`` and from this interpreter's own standard library (never committed): for each regime a training and a
held-out JSON-lines file of ``{"text", "domain"}`` rows, for ``robust-pretrain-decide --train_file ... --validation_file
... --domain_column domain``.

    python scripts/rare_domains_data.py --regime languages --out outputs/rare-domains
    python scripts/rare_domains_data.py --regime code --out outputs/rare-domains

Regimes:

* ``languages``: ``en`` (UD English-EWT train + dev; held out: EWT test) with ``fi``, ``ga``, ``id`` (UD Finnish TDT,
  Irish IDT, Indonesian GSD from ``ud_multilingual``: their dev split trains, their test split is held out), at their
  natural shares; a row is 10 consecutive sentences (these files mark no paragraphs).
* ``code``: ``python``, standard-library modules (every ``.py`` file of 2-40 KB outside test, idlelib, lib2to3,
  turtledemo and site-packages, in path order; every 10th module held out, so held-out code comes from modules never
  trained on) with the five EWT genres as small domains: each genre's EWT-train paragraphs in corpus order until it is
  ~2 % of the training characters; held out: the genre's EWT dev + test paragraphs.

Prints, per domain and split, the rows, characters and sentences (documents for code), and the stdlib it read.
"""

from __future__ import annotations

import argparse
import json
import sys
import sysconfig
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from robust_pretrain.data.conllu import read_conllu  # noqa: E402
from robust_pretrain.data.corpus import paragraphs, resolve_ud_dir  # noqa: E402
from robust_pretrain.data.domains import EWT_GENRES  # noqa: E402

LANGUAGES = {"fi": "fi_tdt", "ga": "ga_idt", "id": "id_gsd"}
SENTENCES_PER_ROW = 10
GENRE_SHARE = 0.02
MODULE_BYTES = (2_000, 40_000)
HELD_OUT_EVERY = 10
SKIPPED_PACKAGES = {"test", "tests", "idlelib", "lib2to3", "turtledemo", "site-packages", "__pycache__"}

Rows = list[dict[str, str]]


def ewt_sentences(split: str, ud_dir: Path):
    return list(read_conllu(ud_dir / f"en_ewt-ud-{split}.conllu"))


def ewt_genre_paragraphs(splits: list[str], ud_dir: Path) -> dict[str, list[str]]:
    """Each genre's paragraphs (``sent_id`` prefix) over ``splits``, in corpus order."""
    by_genre: dict[str, list[str]] = {genre: [] for genre in EWT_GENRES}
    for split in splits:
        sentences = ewt_sentences(split, ud_dir)
        for genre in EWT_GENRES:
            by_genre[genre] += paragraphs(s for s in sentences if (s.doc_id or "").split("-", 1)[0] == genre)
    return by_genre


def sentence_rows(path: Path, domain: str) -> Rows:
    texts = [" ".join(s.text.split()) for s in read_conllu(path)]
    chunks = [texts[i : i + SENTENCES_PER_ROW] for i in range(0, len(texts), SENTENCES_PER_ROW)]
    return [{"text": " ".join(chunk), "domain": domain} for chunk in chunks]


def languages(shared: Path) -> tuple[Rows, Rows]:
    ud_dir = resolve_ud_dir(shared / "ud_ewt")
    train = [{"text": t, "domain": "en"} for ts in ewt_genre_paragraphs(["train", "dev"], ud_dir).values() for t in ts]
    test = [{"text": t, "domain": "en"} for ts in ewt_genre_paragraphs(["test"], ud_dir).values() for t in ts]
    for code, treebank in LANGUAGES.items():
        train += sentence_rows(shared / "ud_multilingual" / f"{treebank}-ud-dev.conllu", code)
        test += sentence_rows(shared / "ud_multilingual" / f"{treebank}-ud-test.conllu", code)
    return train, test


def stdlib_modules() -> list[Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    return [
        path
        for path in sorted(root.rglob("*.py"))
        if MODULE_BYTES[0] <= path.stat().st_size <= MODULE_BYTES[1]
        and not any(part in SKIPPED_PACKAGES or part.startswith("test") for part in path.relative_to(root).parts)
    ]


def code(shared: Path) -> tuple[Rows, Rows]:
    modules = stdlib_modules()
    rows = [{"text": p.read_text(encoding="utf-8", errors="replace"), "domain": "python"} for p in modules]
    train = [row for i, row in enumerate(rows) if i % HELD_OUT_EVERY != HELD_OUT_EVERY - 1]
    test = [row for i, row in enumerate(rows) if i % HELD_OUT_EVERY == HELD_OUT_EVERY - 1]
    code_chars = sum(len(row["text"]) for row in train)
    genre_chars = GENRE_SHARE * code_chars / (1 - GENRE_SHARE * len(EWT_GENRES))
    ud_dir = resolve_ud_dir(shared / "ud_ewt")
    for genre, texts in ewt_genre_paragraphs(["train"], ud_dir).items():
        total = 0
        for text in texts:
            if total >= genre_chars:
                break
            train.append({"text": text, "domain": genre})
            total += len(text)
    for genre, texts in ewt_genre_paragraphs(["dev", "test"], ud_dir).items():
        test += [{"text": text, "domain": genre} for text in texts]
    return train, test


def describe(name: str, rows: Rows) -> None:
    domains = sorted({row["domain"] for row in rows})
    chars = {d: sum(len(r["text"]) for r in rows if r["domain"] == d) for d in domains}
    total = sum(chars.values())
    for d in domains:
        count = sum(1 for r in rows if r["domain"] == d)
        print(f"{name} {d}: {count} rows, {chars[d]:,} characters ({chars[d] / total:.1%})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--regime", choices=["languages", "code"], required=True)
    parser.add_argument("--out", required=True, help="folder for <regime>-train.jsonl and <regime>-test.jsonl")
    parser.add_argument("--shared", default=str(REPO_ROOT.parent / "shared" / "data"))
    args = parser.parse_args()
    train, test = (languages if args.regime == "languages" else code)(Path(args.shared))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for split, rows in (("train", train), ("test", test)):
        path = out / f"{args.regime}-{split}.jsonl"
        path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")
        describe(f"{args.regime} {split}", rows)
    print(f"stdlib: {sysconfig.get_paths()['stdlib']} (Python {sys.version.split()[0]})")


if __name__ == "__main__":
    main()
