#!/usr/bin/env bash
# The commands run on the lent H200 (device tool), so the GPU numbers can be reproduced:
#   bash tools/gpu_session.sh check     # compiled GPU tests, reference check, Triton sweep, bench_quant
#   bash tools/gpu_session.sh bench     # compiled kernel suite + the four benchmarks
#   bash tools/gpu_session.sh pilot     # h200 warm-up + the pilot arms (resumable)
# The image lacks grain/tensorboardX: carried as wheels in .whl/ (see README "GPU runs").
# Each step has its own time limit and logs to $OUT/log.txt; results are tarred into $OUT.
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site
fi
export PYTHONUNBUFFERED=1
log="$OUT/log.txt"
step() {  # step NAME SECONDS CMD...
  local name=$1 limit=$2; shift 2
  echo "=== $name: $* (limit ${limit}s) $(date +%T)" | tee -a "$log"
  timeout "$limit" "$@" >>"$log" 2>&1
  echo "=== $name rc=$? $(date +%T)" | tee -a "$log"
}
python -c "import jax; print(jax.devices())" >>"$log" 2>&1
case "${1:-bench}" in
  check)
    step gpu_tests 180 python -m pytest -q -m gpu -x tests/kernels tests/model/test_gpu_impl.py -p no:cacheprovider
    step reference_check 60 python tools/check_gpu_reference.py
    step tune_quant 170 python -m experiments.tune_quant --iters=10
    step bench_quant 170 python -m experiments.bench_quant --iters=10
    cp "$log" benchmarks/gpu_check.log
    tar czf "$OUT/benchmarks.tgz" benchmarks
    ;;
  bench)
    step kernels_gpu 150 python -m pytest -q -m gpu -x tests/kernels -p no:cacheprovider
    step bench_quant 200 python -m experiments.bench_quant --iters=10
    step bench_experts 60 python -m experiments.bench_experts
    step bench_memory 60 python -m experiments.bench_qlinear_memory
    step bench_decode 90 python -m experiments.bench_decode
    tar czf "$OUT/benchmarks.tgz" benchmarks
    ;;
  pilot)
    step pilot "${PILOT_SECONDS:-480}" python -m experiments.ablation --preset h200 --arms=bf16,nvfp4,full --seeds=2 \
      --out=runs/pilot ${PILOT_ARGS:-}
    tar czf "$OUT/pilot.tgz" --exclude=checkpoint --exclude=tb runs/pilot
    ;;
esac
