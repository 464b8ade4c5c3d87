#!/usr/bin/env bash
# A second worker for scripts/rare_domains.sh on a machine with a core to spare: runs the cells of the given seeds of
# one regime as separate processes (robust-pretrain-decide --cell ARM:SEED), with exactly the decide command the
# runner recorded in OUT/commands.txt (the same protocol: decide refuses another). Give it the seeds the runner reaches
# last (it goes seed by seed upward); finished cells are skipped, and it stops at the first refusal, e.g. a cell the
# runner holds (the runner then stops at a cell the worker holds: rerun it, it resumes). It runs in the current
# directory: the worktree the runner uses (frozen at the protocol's commit), whose code the recorded command runs; the
# runner's saver copies the worker's finished cells to STATE too.
#
#   cd ../wt-exp && bash /path/to/scripts/rare_domains_worker.sh REGIME SEED...
#
# Environment: OUT (default outputs/rare-domains).
set -uo pipefail
regime=$1
shift
OUT=${OUT:-outputs/rare-domains}
export HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1
command=$(grep -F -- "--output_dir $OUT/$regime " "$OUT/commands.txt" | tail -1)
if [ -z "$command" ]; then
  echo "$OUT/commands.txt records no decide run of $regime: start scripts/rare_domains.sh first" >&2
  exit 2
fi
read -r -a decide <<< "$command"
arms=$("${decide[0]}" -c "import json; print(' '.join(json.load(open('$OUT/$regime/protocol.json'))['arms']))")
for seed in "$@"; do
  for arm in $arms; do
    [ -f "$OUT/$regime/cells/$arm/seed-$seed/decide_cell.json" ] && continue
    echo "$(date +%T) cell $arm:$seed"
    if ! "${decide[@]}" --cell "$arm:$seed" > "$OUT/worker-$regime-$arm-$seed.log" 2>&1; then
      echo "stopped at $arm:$seed: see $OUT/worker-$regime-$arm-$seed.log" >&2
      exit 1
    fi
  done
done
