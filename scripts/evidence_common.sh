# Sourced by the evidence scripts (scripts/*_evidence.sh) with OUT set: the command list and wall-time list in $OUT
# (appended to), offline, one intra-op thread per process (two on a loaded 2-core machine ran ~15x slower), run() and
# decide_regime().
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

decide_regime() {  # decide_regime REGIME COMMAND...: a decide run resumable across sessions (PY, STATE, RESULTS set)
  # restore the regime's finished cells from $STATE, run COMMAND saving them every 2 minutes too (a run stopped from
  # outside, e.g. a session ending, keeps them) and once more at its end, then copy the verdict to ${RESULTS}_REGIME.*
  local regime=$1 saver status
  shift
  "$PY" scripts/decide_evidence_state.py restore "$OUT/$regime" "$STATE/$regime"
  (while sleep 120; do "$PY" scripts/decide_evidence_state.py save "$OUT/$regime" "$STATE/$regime" > /dev/null; done) &
  saver=$!
  run "decide-$regime" "$@"
  status=$?
  kill "$saver" 2>/dev/null
  "$PY" scripts/decide_evidence_state.py save "$OUT/$regime" "$STATE/$regime"
  if [ "$status" -ne 0 ]; then
    echo "decide $regime stopped (exit $status): see $OUT/decide-$regime.log; rerun to resume" >&2
    return "$status"
  fi
  for ext in md json png; do cp "$OUT/$regime/decision.$ext" "${RESULTS}_$regime.$ext"; done
  cp "$OUT/commands.txt" "${RESULTS}_commands.txt"
  cp "$OUT/timings.txt" "${RESULTS}_timings.txt"
}
