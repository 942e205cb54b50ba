#!/usr/bin/env bash
# One device call of a run that outlasts a call's 10 minutes (`gpu_session.sh $MODE`: MODE long by default,
# bands, matrix, ladder, or several modes in one word list, e.g. MODE="sftstep warmup"):
# the first call copies the tree it was called in (code and .whl) to a folder of the machine's own
# (RUN_DIR) and starts the run there, detached (setsid, so it survives the call while the machine stays
# held): the device tool replaces or removes the carried paths of the working copy at every call, so a
# run must not live in them. Every call then waits up to WAIT seconds and returns the log's tail and a
# snapshot of the run (metrics, no checkpoints) in $OUT; once it has finished, its results too. Call
# again at once to keep the machine (it goes back after 30 s idle, and the run with it); later calls
# run whatever tree they are given and only look at RUN_DIR.
#   device run: bash tools/long_horizon_call.sh        (carry .whl; MODE=bands bash ... for the bands)
set -u
OUT=${OUT:-/tmp/out}
MODE=${MODE:-long}
RUN_DIR=${RUN_DIR:-/tmp/long_run_${MODE// /_}}
if [ ! -e "$RUN_DIR/started" ]; then
  mkdir -p "$RUN_DIR/tree"
  cp -r README.md benchmarks docs experiments fp4rl pallas_kernels pyproject.toml tests tools "$RUN_DIR/tree/"
  [ -d .whl ] && cp -r .whl "$RUN_DIR/tree/"
  # a ladder rung's stored rollouts, carried in for its later measurement parts (gpu_session.sh ladder_rung)
  for f in runs/*/gradients/rollouts.npz; do [ -f "$f" ] && cp --parents "$f" "$RUN_DIR/tree/"; done
  date > "$RUN_DIR/started"
  # shellcheck disable=SC2086  # MODE: one or more modes
  (cd "$RUN_DIR/tree" && OUT=$RUN_DIR SESSION_SECONDS=${SESSION_SECONDS:-3000} setsid nohup \
    bash -c "bash tools/gpu_session.sh $MODE; touch $RUN_DIR/done" >"$RUN_DIR/console.txt" 2>&1 </dev/null &)
fi
# WAIT: 6 minutes by default, well inside a call's 10 minutes: shorter calls bring the logs back more
# often and leave the caller's side more room to send the next call within the 30 s idle release
deadline=$(( $(date +%s) + ${WAIT:-360} ))
while [ "$(date +%s)" -lt "$deadline" ] && [ ! -e "$RUN_DIR/done" ]; do sleep 10; done
tail -c 3000 "$RUN_DIR/log.txt" 2>/dev/null | tr '\r' '\n' | tail -n 25
cp "$RUN_DIR/log.txt" "$OUT/" 2>/dev/null
snapshot() {  # snapshot NAME: the runs' metrics and tables, no checkpoints or weights (the matrix's runs live in MATRIX_DIR)
  local matrix=${MATRIX_DIR:-/tmp/fp4rl-matrix}
  # shellcheck disable=SC2046  # the matrix folder, where there is one
  tar czf "$OUT/$1" --exclude=checkpoint --exclude=tb --exclude=.jax_cache --exclude='*.safetensors' -C "$RUN_DIR/tree" runs \
    $([ -d "$matrix" ] && echo "-C $matrix .") 2>/dev/null
}
if [ -e "$RUN_DIR/done" ]; then
  cp "$RUN_DIR"/*.tgz "$RUN_DIR"/*.jsonl "$RUN_DIR"/*.csv "$OUT/" 2>/dev/null  # what the modes wrote to their $OUT
  snapshot runs.tgz
  echo "=== finished"
else
  snapshot partial.tgz
  echo "=== still running"
fi
