# Sourced by the evidence scripts (scripts/*_evidence.sh) with OUT set: an empty command list and wall-time list in
# $OUT, offline, one intra-op thread per process (two on a loaded 2-core machine ran ~15x slower), and run().
export HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1
mkdir -p "$OUT"
: > "$OUT/timings.txt"
: > "$OUT/commands.txt"

run() {  # run NAME COMMAND...: run, log to $OUT/NAME.log, record the command and its wall time
  local name=$1 start
  shift
  echo "$*" >> "$OUT/commands.txt"
  echo "+ $*"
  start=$(date +%s)
  "$@" > "$OUT/$name.log" 2>&1
  echo "$name $(( $(date +%s) - start ))" >> "$OUT/timings.txt"
}
