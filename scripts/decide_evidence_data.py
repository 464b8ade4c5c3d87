"""The data of the imbalanced-domain experiment (``scripts/decide_evidence_protocol.md``), written at run time from
``../shared`` (UD English-EWT train + dev paragraphs, by genre) and from this interpreter's own standard library
(never committed): one JSON-lines file of ``{"text", "domain"}`` rows for ``robust-pretrain-decide --train_file ...
--domain_column domain``.

    python scripts/decide_evidence_data.py --regime python --out outputs/decide-evidence/python.jsonl
    python scripts/decide_evidence_data.py --regime rare_email --out outputs/decide-evidence/rare_email.jsonl

Regimes:

* ``python``: the five EWT genres in full, plus ``python``: whole standard-library modules (top-level ``.py`` files of
  0.5-6 KB, in name order) until they are ~3.5 % of the characters (~3 % of the training text once 15 % of the rows
  are held out); a row is a whole module, so the held-out split (whole rows) holds code from modules never trained on.
* ``rare_email``: the five EWT genres, ``email`` cut (its first paragraphs, in corpus order) to ~2.6 % of the text.

Prints each domain's share of the characters.
"""

from __future__ import annotations

import argparse
import json
import sys
import sysconfig
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from robust_pretrain.data.domains import DOMAIN_COLUMN, EWT_GENRES, ewt_genre_texts  # noqa: E402

PYTHON_SHARE = 0.035
RARE_SHARE = 0.026
MODULE_BYTES = (500, 6_000)


def ewt_rows(ud_dir: str | None) -> list[dict[str, str]]:
    corpus = ewt_genre_texts("train", ud_dir)
    return [
        {"text": text, "domain": EWT_GENRES[d]} for text, d in zip(corpus["text"], corpus[DOMAIN_COLUMN], strict=True)
    ]


def stdlib_modules(target_chars: int) -> list[dict[str, str]]:
    """Whole standard-library modules in name order until ``target_chars`` characters."""
    rows, total = [], 0
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        if not MODULE_BYTES[0] <= path.stat().st_size <= MODULE_BYTES[1]:
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        rows.append({"text": text, "domain": "python"})
        total += len(text)
        if total >= target_chars:
            break
    return rows


def regime_rows(regime: str, ud_dir: str | None) -> list[dict[str, str]]:
    rows = ewt_rows(ud_dir)
    chars = sum(len(row["text"]) for row in rows)
    if regime == "python":
        return rows + stdlib_modules(round(chars * PYTHON_SHARE / (1 - PYTHON_SHARE)))
    others = sum(len(row["text"]) for row in rows if row["domain"] != "email")
    budget, kept = others * RARE_SHARE / (1 - RARE_SHARE), 0
    selected = []
    for row in rows:
        if row["domain"] == "email":
            if kept >= budget:
                continue
            kept += len(row["text"])
        selected.append(row)
    return selected


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--regime", choices=["python", "rare_email"], required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--ud_dir", help="UD English-EWT folder (default: the recipes' default)")
    cli = parser.parse_args()
    rows = regime_rows(cli.regime, cli.ud_dir)
    out = Path(cli.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    chars = {}
    for row in rows:
        chars[row["domain"]] = chars.get(row["domain"], 0) + len(row["text"])
    total = sum(chars.values())
    print(f"{out}: {len(rows)} rows; " + ", ".join(f"{d} {c / total:.3f}" for d, c in sorted(chars.items())))


if __name__ == "__main__":
    main()
