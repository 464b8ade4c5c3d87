"""The natural-only pilot of the rare-domains experiment (``scripts/rare_domains_protocol.md``): per regime, the
budget rule's ``max_steps`` from the training sequences, one ``natural`` run (seed 41) read 4 times over training, the
held-out size per domain, and the regime criterion's outcome. Writes
``benchmarks/results/rare_domains_pilot.{md,json}``.

    python scripts/rare_domains_pilot.py [--out outputs/rare-domains] [--regimes languages code]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from rare_domains_data import LANGUAGES, REPO_ROOT, ewt_sentences, resolve_ud_dir
from transformers import AutoTokenizer

from robust_pretrain.data.conllu import read_conllu
from robust_pretrain.data.domains import EWT_GENRES

RARE = {"languages": ["fi", "ga", "id"], "code": list(EWT_GENRES)}
BATCH, MAX_STEPS, MAX_EPOCHS, READINGS, SEED = 16, 600, 2, 4, 41
MIN_TOKENS, MIN_SENTENCES, MIN_DOCUMENTS = 5_000, 200, 20
RESULTS = REPO_ROOT / "benchmarks" / "results" / "rare_domains_pilot"


def recipe(out: Path, regime: str, folder: Path, *extra: str) -> dict:
    """One natural run of the decoder demo on the regime's files; its task report."""
    command = [
        str(Path(sys.executable).parent / "robust-pretrain-causal-lm"), "--config", "decoder_demo",
        "--train_file", str(out / f"{regime}-train.jsonl"), "--validation_file", str(out / f"{regime}-test.jsonl"),
        "--domain_column", "domain", "--weighting", "proportional", "--seed", str(SEED), "--disable_tqdm", "true",
        "--save_strategy", "no", "--output_dir", str(folder), "--overwrite_output_dir", "true", *extra,
    ]  # fmt: skip
    print("+", " ".join(command), flush=True)
    with open(folder.with_suffix(".log"), "w") as log:
        subprocess.run(command, check=True, stdout=log, stderr=subprocess.STDOUT, cwd=REPO_ROOT)
    return json.loads((folder / "task_report.json").read_text())


def held_out_units(regime: str, rows: list[dict]) -> dict[str, tuple[int, str]]:
    """Sentences per held-out domain (documents for ``python``)."""
    shared = REPO_ROOT.parent / "shared" / "data"
    if regime == "languages":
        units = {"en": (len(ewt_sentences("test", resolve_ud_dir(shared / "ud_ewt"))), "sentences")}
        for code, bank in LANGUAGES.items():
            units[code] = (
                sum(1 for _ in read_conllu(shared / "ud_multilingual" / f"{bank}-ud-test.conllu")),
                "sentences",
            )
        return units
    ud_dir = resolve_ud_dir(shared / "ud_ewt")
    sentences = [s for split in ("dev", "test") for s in ewt_sentences(split, ud_dir)]
    units = {g: (sum(1 for s in sentences if (s.doc_id or "").startswith(g + "-")), "sentences") for g in EWT_GENRES}
    units["python"] = (sum(1 for row in rows if row["domain"] == "python"), "documents")
    return units


def held_out_tokens(tokenizer_dir: Path, rows: list[dict]) -> dict[str, int]:
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    counts: dict[str, int] = {}
    for row in rows:
        ids = tokenizer(row["text"], add_special_tokens=False)["input_ids"]
        counts[row["domain"]] = counts.get(row["domain"], 0) + len(ids)
    return counts


def readings(folder: Path, names: list[str]) -> list[dict]:
    history = json.loads((folder / "trainer_state.json").read_text())["log_history"]
    by_step = {
        e["step"]: {n: e[f"eval_task_loss/{n}"] for n in names} for e in history if f"eval_task_loss/{names[0]}" in e
    }
    return [{"step": step, "loss": loss} for step, loss in sorted(by_step.items())]


def pilot(regime: str, out: Path) -> dict:
    subprocess.run([sys.executable, str(REPO_ROOT / "scripts" / "rare_domains_data.py"), "--regime", regime,
                    "--out", str(out)], check=True)  # fmt: skip
    probe = recipe(out, regime, out / f"pilot-{regime}-probe", "--max_steps", "2")
    sequences = probe["training_sequences"]
    total = sum(sequences.values())
    steps = min(MAX_STEPS, READINGS * (MAX_EPOCHS * total // (BATCH * READINGS)))
    folder = out / f"pilot-{regime}"
    report = recipe(out, regime, folder, "--max_steps", str(steps), "--eval_strategy", "steps",
                    "--eval_steps", str(steps // READINGS))  # fmt: skip
    names = report["tasks"]
    rows = [json.loads(line) for line in (out / f"{regime}-test.jsonl").read_text().splitlines()]
    tokens, units = held_out_tokens(folder, rows), held_out_units(regime, rows)
    losses = report["eval_task_loss"]
    worst = max(losses, key=losses.get)
    epochs = steps * BATCH / total
    count, unit = units[worst]
    checks = {
        "worst domain is rare": worst in RARE[regime],
        "worst domain's held-out set is large enough": tokens[worst] >= MIN_TOKENS
        and count >= (MIN_DOCUMENTS if unit == "documents" else MIN_SENTENCES),
        "every held-out set >= 5,000 tokens": all(tokens[n] >= MIN_TOKENS for n in names),
        "natural drew <= 2.05 epochs": epochs <= 2.05,
    }
    return {
        "regime": regime, "seed": SEED, "max_steps": steps, "training_sequences": sequences,
        "natural_shares": report["mixture_weights"], "epochs_drawn_by_natural": epochs,
        "held_out_tokens": tokens, "held_out_units": {n: {"count": c, "unit": u} for n, (c, u) in units.items()},
        "readings": readings(folder, names), "final_loss": losses, "worst_domain": worst,
        "checks": checks, "has_room": all(checks.values()),
    }  # fmt: skip


def card(results: list[dict], commit: str) -> str:
    lines = ["# Rare-domains experiment: the natural-only pilot", "",
             f"Protocol `scripts/rare_domains_protocol.md`; `python scripts/rare_domains_pilot.py` at {commit}; "
             f"seed {SEED}, the decoder demo, natural sampling, {READINGS} held-out readings.", ""]  # fmt: skip
    for r in results:
        names = list(r["final_loss"])
        lines += [f"## Regime `{r['regime']}`: {'has room' if r['has_room'] else 'NO ROOM'}", "",
                  f"max_steps {r['max_steps']} (budget rule; {sum(r['training_sequences'].values())} training "
                  f"sequences), natural drew {r['epochs_drawn_by_natural']:.2f} epochs of every domain.", "",
                  "| domain | natural share | training sequences | held-out tokens | held-out units | "
                  + " | ".join(f"loss @ {x['step']}" for x in r["readings"]) + " |",
                  "|---|---|---|---|---|" + "---|" * len(r["readings"])]  # fmt: skip
        for n in names:
            u = r["held_out_units"][n]
            losses = " | ".join(f"{x['loss'][n]:.3f}" for x in r["readings"])
            lines.append(f"| {n} | {r['natural_shares'][n]:.3f} | {r['training_sequences'][n]} | "
                         f"{r['held_out_tokens'][n]:,} | {u['count']} {u['unit']} | {losses} |")  # fmt: skip
        worst_by_reading = ", ".join(f"{x['step']}: {max(x['loss'], key=x['loss'].get)}" for x in r["readings"])
        lines += ["", f"Worst domain by reading: {worst_by_reading}.", ""]
        lines += [f"- {name}: {'yes' if ok else 'no'}" for name, ok in r["checks"].items()] + [""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="outputs/rare-domains")
    parser.add_argument("--regimes", nargs="+", default=["languages", "code"])
    args = parser.parse_args()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO_ROOT)
    results = [pilot(regime, out) for regime in args.regimes]
    RESULTS.with_suffix(".json").write_text(json.dumps({"commit": commit.stdout.strip(), "regimes": results},
                                                       indent=2) + "\n")  # fmt: skip
    RESULTS.with_suffix(".md").write_text(card(results, commit.stdout.strip()))
    print(RESULTS.with_suffix(".md").read_text())


if __name__ == "__main__":
    main()
