#!/usr/bin/env bash
# Issue 32 item 1: the vision demo pre-trained with each cross-attention decoder variant (project, multimae), minimax,
# seeds 42 and 43, then the comparison table in benchmarks/results/vision_decoder.md. Protocol and decision rule:
# scripts/vision_decoder_protocol.md.
#
#   bash scripts/vision_decoder.sh [OUT]          (OUT defaults to outputs/vision-decoder)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-outputs/vision-decoder}
PY=${PY:-.venv/bin/python}
source scripts/evidence_common.sh

for variant in project multimae; do
  run "pretraining-$variant" "$PY" recipes/compare_weightings.py --config recipes/configs/vision_demo.yaml \
    --strategies minimax --seeds 42 43 --output_dir "$OUT/$variant" -- --decoder_variant "$variant" --disable_tqdm true
done
"$PY" - "$OUT" <<'PYTHON'
import json, statistics, sys
from pathlib import Path
out = Path(sys.argv[1])
rows = ["| variant | seed | " + " | ".join(["rgb", "depth", "semseg", "mean", "worst"]) + " |", "|---" * 7 + "|"]
summary = {}
for variant in ("project", "multimae"):
    means = []
    for seed in (42, 43):
        losses = json.loads((out / variant / "minimax" / f"seed-{seed}" / "task_report.json").read_text())["eval_task_loss"]
        mean, worst = statistics.fmean(losses.values()), max(losses.values())
        means.append(mean)
        rows.append(f"| {variant} | {seed} | " + " | ".join(f"{losses[m]:.4f}" for m in ("rgb", "depth", "semseg"))
                    + f" | {mean:.4f} | {worst:.4f} |")
    summary[variant] = {"means": means, "spread": abs(means[0] - means[1])}
both = all(p < m for p, m in zip(summary["project"]["means"], summary["multimae"]["means"]))
gap = statistics.fmean(summary["multimae"]["means"]) - statistics.fmean(summary["project"]["means"])
keep_project = both and gap > max(summary["project"]["spread"], summary["multimae"]["spread"])
verdict = "project stays the default" if keep_project else "multimae becomes the default"
text = "\n".join(["# Vision decoder variants (protocol: scripts/vision_decoder_protocol.md)", "", *rows, "",
                  f"Mean held-out loss, multimae - project: {gap:+.4f}; rule: **{verdict}**.", ""])
Path("benchmarks/results/vision_decoder.md").write_text(text)
Path("benchmarks/results/vision_decoder.json").write_text(json.dumps({"summary": summary, "verdict": verdict}, indent=1))
print(text)
PYTHON
