#!/usr/bin/env bash
# One device call of a run that outlasts a call's 10 minutes (`gpu_session.sh $MODE`: MODE long by default,
# bands, or several modes in one word list, e.g. MODE="sftstep warmup"):
# the first call starts it detached (setsid, so it survives the call while the machine stays held),
# every call then waits up to WAIT seconds and returns the log's tail and a snapshot of the run
# (metrics, no checkpoints) in $OUT; once it has finished, its results tarball too. Call again at
# once to keep the machine (it goes back after 30 s idle, and the run with it).
#   device run: bash tools/long_horizon_call.sh        (carry .whl; MODE=bands bash ... for the bands)
set -u
OUT=${OUT:-/tmp/out}
MODE=${MODE:-long}
RUN_OUT=/tmp/long_run_${MODE// /_}
if [ ! -e "$RUN_OUT/started" ]; then
  mkdir -p "$RUN_OUT" && date > "$RUN_OUT/started"
  # shellcheck disable=SC2086  # MODE: one or more modes
  OUT=$RUN_OUT SESSION_SECONDS=${SESSION_SECONDS:-3000} setsid nohup bash -c "bash tools/gpu_session.sh $MODE; touch $RUN_OUT/done" \
    >"$RUN_OUT/console.txt" 2>&1 </dev/null &
fi
deadline=$(( $(date +%s) + ${WAIT:-540} ))
while [ "$(date +%s)" -lt "$deadline" ] && [ ! -e "$RUN_OUT/done" ]; do sleep 10; done
tail -c 3000 "$RUN_OUT/log.txt" 2>/dev/null | tr '\r' '\n' | tail -n 25
cp "$RUN_OUT/log.txt" "$OUT/" 2>/dev/null
if [ -e "$RUN_OUT/done" ]; then
  cp "$RUN_OUT"/*.tgz "$RUN_OUT"/*.jsonl "$RUN_OUT"/*.csv "$OUT/" 2>/dev/null  # what the modes wrote to their $OUT
  tar czf "$OUT/runs.tgz" --exclude=checkpoint --exclude=tb --exclude=.jax_cache runs 2>/dev/null
  echo "=== finished"
else
  tar czf "$OUT/partial.tgz" --exclude=checkpoint --exclude=tb --exclude=.jax_cache runs 2>/dev/null
  echo "=== still running"
fi
