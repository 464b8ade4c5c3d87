# Sourced by the evidence scripts (scripts/*_evidence.sh) with OUT set: the command list and wall-time list in $OUT
# (appended to), offline, one intra-op thread per process (two on a loaded 2-core machine ran ~15x slower), and run().
export HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1
mkdir -p "$OUT"
# kept across invocations (a resumed experiment keeps its earlier wall times): each invocation starts with a # line
echo "# $(date -u '+%Y-%m-%d %H:%M UTC') $0" | tee -a "$OUT/timings.txt" >> "$OUT/commands.txt"

run() {  # run NAME COMMAND...: run, log to $OUT/NAME.log, record the command and its wall time, return its status
  local name=$1 start
  shift
  echo "$*" >> "$OUT/commands.txt"
  echo "+ $*"
  start=$(date +%s)
  "$@" > "$OUT/$name.log" 2>&1
  local status=$?
  echo "$name $(( $(date +%s) - start ))" >> "$OUT/timings.txt"
  return "$status"
}
