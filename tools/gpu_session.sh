#!/usr/bin/env bash
# The commands run on the lent H200 (device tool), so the GPU numbers can be reproduced:
#   bash tools/gpu_session.sh check     # compiled Triton + model GPU tests, bench_quant, compiled Mosaic tests
#   bash tools/gpu_session.sh tune      # XLA:GPU reference vs oracle check, Triton launch-shape sweep
#   bash tools/gpu_session.sh diagnose  # the model GPU test and the Mosaic suite, verbose (per test, per phase)
#   bash tools/gpu_session.sh MODE...   # several modes in one device call, in order
#   bash tools/gpu_session.sh bench     # compiled kernel suite + the four benchmarks
#   bash tools/gpu_session.sh pilot     # h200 warm-up + the pilot arms (resumable)
#   bash tools/gpu_session.sh learn     # h200 warm-up + bf16 RL (RL_ARGS), then the learning analysis
#   bash tools/gpu_session.sh long      # h200-long warm-up + bf16 RL on the long-horizon task (2 seeds x 300
#                                       # steps, GEMM backend LONG_GEMM), then the learning analysis; one run
#                                       # outlasts a call: start it detached (tools/long_horizon_call.sh)
#   bash tools/gpu_session.sh bands     # candidate long-horizon bands (BANDS) at once: each one's warm-up, and bf16
#                                       # RL (2 seeds x 300 steps) on each warm-up inside the band
#                                       # (fp4rl.analysis.band), then its verdict; start it detached
#                                       # (MODE=bands tools/long_horizon_call.sh)
#   bash tools/gpu_session.sh gradients # h200 warm-up + the fixed-parameter gradient measurements (GRAD_ARGS),
#                                       # into runs/h200/gradients/GRAD_PART on the batches of
#                                       # results/gradients_h200/parts/rollouts.npz: not tracked, so before the
#                                       # call `python tools/data_files.py fetch` here and carry that path
#                                       # (refused at once without it, unless a warm machine has the copy)
#   bash tools/gpu_session.sh arms      # h200 warm-up + the ablation arms ARMS (comma separated) x SEEDS seeds
#   bash tools/gpu_session.sh matrix    # the same on MATRIX_PRESET (h200 by default), PARALLEL arms at a time per
#                                       # GPU as separate processes, resumable
#                                       # across calls on a warm machine (runs in MATRIX_DIR); a job ARM:FIRST runs
#                                       # seeds FIRST.. in MATRIX_DIR/seedsFIRST; the h200-chain matrix runs 2 seeds
#                                       # per job, one job per GPU (fp4rl.analysis.matrix_status names the next;
#                                       # tools/matrix_merge.sh merges a call's runs into the committed matrix);
#                                       # MPS=1 runs the jobs of one GPU side by side through CUDA MPS
#   bash tools/gpu_session.sh compile   # the RL update program's compile time per arm x GEMM backend x XLA_FLAGS
#                                       # variant (COMPILE_ARMS, COMPILE_GEMMS, SEEDS; no warm-up needed); the
#                                       # fastest one as GEMM=...; XLA_FLAGS=... into COMPILE_CHOICE
#   bash tools/gpu_session.sh threefry  # threefry draws lowered to JAX's GPU kernel: same bytes (compiled test), and the
#                                       # update program's compile time with and without it (COMPILE_ARMS: nvfp4-pt)
#   bash tools/gpu_session.sh division  # XLA:GPU's f32 division made IEEE (fp4rl.xla_flags.IEEE_GPU_DIVISION): the
#                                       # reference against the NumPy oracle and the compiled SR tests with it, then the
#                                       # update and sampler programs' compile times without and with it (COMPILE_ARMS)
#   bash tools/gpu_session.sh rlstep    # warm-up + RL step time per arm (ARMS) x expert GEMM backend (GEMMS)
#                                       # (RLSTEP_PRESET: h200 by default)
#   bash tools/gpu_session.sh warmup    # a warm-up alone (WARMUP_PRESET, h200 by default)
#   bash tools/gpu_session.sh sftstep   # warm-up step time per expert GEMM x deterministic ops x batch, and a
#                                       # profile (tools/sft_step_time.py, SFTSTEP_PRESET)
#   bash tools/gpu_session.sh serve_eval # h200 warm-up + the deployment correlation (SERVE_ARGS; resumable)
#   bash tools/gpu_session.sh grouped   # compiled grouped-GEMM (Mosaic, packed-weight Mosaic) tests + bench_experts
#                                       # (BENCH_ARGS)
#   bash tools/gpu_session.sh weight_gemm # compiled packed-NVFP4-weight GEMM tests (Triton, WGMMA) + bench_weight_gemm
#                                       # (BENCH_ARGS)
#   bash tools/gpu_session.sh packed_kernels # expert_gemm="packed_wgmma"'s Mosaic kernels: compiled tests,
#                                       # bench_weight_gemm, bench_experts and bench_decode beside the other backends
#   bash tools/gpu_session.sh wgmma_sass # the WGMMA decode kernel's SASS (tools/mosaic_sass.py reads it), a wider
#                                       # launch-shape sweep, packed_wgmma in qdot and the sampler with compiles logged
#   bash tools/gpu_session.sh triton    # the compiled Triton kernel suite alone
#   bash tools/gpu_session.sh mosaic    # the compiled Mosaic GPU kernel suite alone
#   bash tools/gpu_session.sh model     # the model GPU test alone (Triton impl == reference, bitwise)
#   bash tools/gpu_session.sh sampler   # the rollout program's decode-loop structure keeps every byte (compiled)
#   bash tools/gpu_session.sh quant     # bench_quant alone (BENCH_ARGS)
#   bash tools/gpu_session.sh decode    # bench_decode (bf16, full) x expert GEMM backend (DECODE_GEMMS), each with a
#                                       # profiled call: per-kernel time per step
#   bash tools/gpu_session.sh probe     # compiled Mosaic bf16 cases vs the NumPy oracle, field by field
#   bash tools/gpu_session.sh ladder    # the model-size ladder, one rung per call (LADDER=RUNG; LADDER_PARTS: its
#                                       # measurement parts; results/scaling_h200/status.md names each call): its
#                                       # warm-up, the band check, and, in the band, the gradient measurement parts,
#                                       # each process's peak memory recorded; outlasts a call: start it detached
#                                       # (RUN_DIR=/tmp/ladder_RUNG MODE=ladder tools/long_horizon_call.sh)
#   bash tools/gpu_session.sh hf        # the `hf` preset (the paper's path) on a local ~320M-parameter Qwen3-MoE
#                                       # checkpoint and DAPO-Math-style rows: HF_STEPS RL steps, step time and memory
# The image lacks grain/tensorboardX (and tokenizers/jinja2/safetensors for `hf`): carried as wheels in .whl/
# (see README "GPU runs").
# Each step has its own time limit and logs to $OUT/log.txt; results are tarred into $OUT.
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site
fi
export PYTHONUNBUFFERED=1
# The kernel suites compile hundreds of small kernels (CPU-bound): GPU_WORKERS pytest processes
# share the GPU, each allocating on demand instead of preallocating most of its memory.
export XLA_PYTHON_CLIENT_PREALLOCATE=false
# Compiled programs outlive a call while the machine stays warm (the next call skips compiling them).
export JAX_COMPILATION_CACHE_DIR=${JAX_COMPILATION_CACHE_DIR:-/tmp/jax_cache}
par="-n ${GPU_WORKERS:-4}"
log="$OUT/log.txt"
START=$(date +%s)
step() {  # step NAME SECONDS CMD...  (never past SESSION_SECONDS, so the results are always packed)
  local name=$1 limit=$2; shift 2
  local left=$(( ${SESSION_SECONDS:-575} - ($(date +%s) - START) ))
  [ "$left" -lt "$limit" ] && limit=$left
  [ "$limit" -le 5 ] && { echo "=== $name skipped: no time left" | tee -a "$log"; return 124; }
  echo "=== $name: $* (limit ${limit}s) $(date +%T)" | tee -a "$log"
  timeout "$limit" "$@" >>"$log" 2>&1
  local rc=$?
  echo "=== $name rc=$rc $(date +%T)" | tee -a "$log"
  return $rc
}
# CUDA MPS for the matrix's processes (MPS=1). A machine whose runtime refuses it (or lacks the control
# program) is told in the log, and the jobs then time-share the GPU as without it: MPS changes where
# kernels run, not what they compute. A probe process must reach the GPU through it first, so a
# daemon that starts but serves no client cannot fail the jobs.
mps_start() {  # mps_start DIR: the daemon's pipes and logs in MPS_DIR (/tmp/mps); DIR/mps.txt says what happened
  mkdir -p "$1"
  if ! command -v nvidia-cuda-mps-control >/dev/null 2>&1; then
    echo "=== MPS: nvidia-cuda-mps-control not found: the jobs time-share the GPU" | tee -a "$log" "$1/mps.txt"; return 1
  fi
  export CUDA_MPS_PIPE_DIRECTORY=${MPS_DIR:-/tmp/mps}/pipe CUDA_MPS_LOG_DIRECTORY=${MPS_DIR:-/tmp/mps}/log
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  # a daemon left by an earlier call on this machine (a daemon outlives the call that started it) serves again
  if { echo get_server_list | nvidia-cuda-mps-control >/dev/null 2>&1 || nvidia-cuda-mps-control -d >>"$1/mps.txt" 2>&1; } \
      && timeout 120 python -c "import jax, jax.numpy as jnp; print(jax.devices(), float(jnp.ones(4).sum()))" >>"$1/mps.txt" 2>&1; then
    echo "=== MPS: daemon up, a client reached the GPU through it" | tee -a "$log" "$1/mps.txt"
  else
    echo "=== MPS: refused here (see mps.txt): the jobs time-share the GPU" | tee -a "$log" "$1/mps.txt"
    echo quit | nvidia-cuda-mps-control >/dev/null 2>&1
    unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
    return 1
  fi
}
mps_stop() {  # mps_stop DIR: stops the daemon; its log joins DIR (it travels in matrix.tgz)
  [ -n "${CUDA_MPS_PIPE_DIRECTORY:-}" ] || return 0
  echo quit | nvidia-cuda-mps-control >/dev/null 2>&1
  cat "$CUDA_MPS_LOG_DIRECTORY"/*.log >>"$1/mps.txt" 2>/dev/null
  echo "=== MPS: daemon stopped" | tee -a "$log"
}
# The model test compares two compiled training steps bit for bit: GPU scatter-adds (the embedding
# gradient) use atomics, whose order differs between runs unless XLA is told not to. -v streams one
# line per test and -s the model test's phase times, so a step cut by its limit says how far it got.
model_tests() {  # model_tests SECONDS
  XLA_FLAGS=--xla_gpu_deterministic_ops=true step gpu_tests_model "$1" python -m pytest -v -s -rf --tb=short -m gpu \
    tests/model/test_gpu_impl.py -k "${MODEL_TESTS:-auto or full}" -p no:cacheprovider
}
triton_tests() {  # triton_tests SECONDS
  step gpu_tests_triton "$1" python -m pytest $par -v -rf --tb=short -m gpu tests/kernels/test_triton.py -p no:cacheprovider
}
mosaic_tests() {  # mosaic_tests SECONDS  (MOSAIC_K: a pytest -k selection; MOSAIC_IDS: a file of test ids)
  local tests=tests/kernels/test_mosaic.py
  [ -n "${MOSAIC_IDS:-}" ] && tests=$(cat "$MOSAIC_IDS")
  # shellcheck disable=SC2086  # the ids are words
  step gpu_tests_mosaic "$1" python -m pytest $par -v -rf --tb=line -m gpu $tests -p no:cacheprovider ${MOSAIC_K:+-k "$MOSAIC_K"}
}
gemm_tests_and_bench() {  # NAME "TEST_FILES" TEST_SECONDS BENCH DEFAULT_BENCH_SECONDS: compiled tests, then the benchmark
  # shellcheck disable=SC2086  # TEST_FILES are words
  step "gpu_tests_$1" "$3" python -m pytest -v -rf --tb=short -m gpu $2 -p no:cacheprovider
  # shellcheck disable=SC2086  # BENCH_ARGS are words
  step "$4" "${BENCH_SECONDS:-$5}" python -m "experiments.$4" ${BENCH_ARGS:-}
  mkdir -p benchmarks/logs && cp "$log" "benchmarks/logs/gpu_$1.log"
  tar czf "$OUT/benchmarks.tgz" benchmarks
}
# warmup [PRESET]: the preset's warm-up (h200 unless named), deterministic (experiments.sft sets
# --xla_gpu_deterministic_ops). A call on a machine still warm from the previous one copies it from
# WARMUP_CACHE instead of retraining; either way its parameters' SHA-256 is compared with the expected
# one (WARMUP_SHA256; without one the digest is printed for the next call to compare). It trains under
# the default XLA_FLAGS, whatever flags the RL runs of the call use, so its bytes do not depend on them.
warmup() {
  local preset=${1:-h200}
  local cache=${WARMUP_CACHE:-/tmp/fp4rl-warmup/$preset-sft}
  local expected=${WARMUP_SHA256:-}
  # No digest is recorded for this code's warm-ups yet (the committed results name theirs): pass
  # WARMUP_SHA256 to hold a call to one, or compare the digests two calls print.
  if [ -f "$cache/sft_meta.json" ] && [ ! -e "runs/$preset/sft/sft_meta.json" ]; then
    mkdir -p "runs/$preset" && cp -r "$cache" "runs/$preset/sft" && echo "=== warmup: copied from $cache" | tee -a "$log"
  elif [ ! -e "runs/$preset/sft/sft_meta.json" ]; then
    XLA_FLAGS= step "warmup_$preset" "${WARMUP_SECONDS:-240}" python -m experiments.sft --preset "$preset" ${SFT_ARGS:-} || return 1
    mkdir -p "$(dirname "$cache")" && rm -rf "$cache" && cp -r "runs/$preset/sft" "$cache"
  fi
  python - "runs/$preset/sft/sft_meta.json" "$expected" <<'PY' 2>&1 | tee -a "$log"
import json, sys
new, ref = json.load(open(sys.argv[1]))["params_sha256"], sys.argv[2]
verdict = "(no expected digest)" if not ref else "== the expected one" if new == ref else "!= the expected " + ref
print(f"=== warmup params_sha256 {new} {verdict}")
PY
}
# ladder_rung RUNG: one rung of the model-size ladder, resumable across calls. Its deterministic warm-up
# (LADDER_SFT_STEPS=N: N steps instead of the preset's, the band rule's second try, in runs/RUNG/sft-stepsN; a
# call on a machine still warm from the last one copies it from LADDER_CACHE; WARMUP_SHA256 holds it to
# the digest an earlier call recorded), its place against the RL band (`fp4rl.analysis.band`: outside it,
# nothing is measured), then the measurement parts LADDER_PARTS (1-based indices into configs.LADDER_PARTS[RUNG];
# all by default; one with gradients.json is skipped) on the rung's stored rollouts
# (runs/RUNG/gradients/rollouts.npz: drawn by the first part measured, carried in by later calls). Every
# process runs under tools/measure_usage.py: its peak device memory and seconds go to runs/RUNG/usage_*.json,
# also when it fails (out of memory included). Back in $OUT: ladder_RUNG.tgz (the warm-up's metadata, the
# band, the usage records), ladder_RUNG_partK.tgz per part measured (its raw arrays too) and
# ladder_RUNG_rollouts.tgz, for `python -m experiments.scaling collect`.
ladder_rung() {
  local rung=$1 dir=runs/$1 sft_dir sft_args=() parts n=0 recipes
  local spec
  spec=$(python -c "from fp4rl import configs; print(configs.SFT_PRESETS['$rung'].out, \
    ' '.join(','.join(p) for p in configs.LADDER_PARTS['$rung']))") || return 2
  read -r sft_dir parts <<<"$spec"
  if [ -n "${LADDER_SFT_STEPS:-}" ]; then
    sft_dir=$dir/sft-steps$LADDER_SFT_STEPS && sft_args=(--steps="$LADDER_SFT_STEPS" --out="$sft_dir")
  fi
  mkdir -p "$dir/gradients"
  printf '{"rung": "%s", "sft_dir": "%s", "sft_steps": %s, "parts": "%s"}\n' "$rung" "$sft_dir" \
    "${LADDER_SFT_STEPS:-null}" "$parts" >"$dir/ladder.json"
  local cache=${LADDER_CACHE:-/tmp/fp4rl-warmup}/$rung-$(basename "$sft_dir")
  if [ ! -e "$sft_dir/sft_meta.json" ] && [ -f "$cache/sft_meta.json" ]; then
    mkdir -p "$(dirname "$sft_dir")" && cp -r "$cache" "$sft_dir" && echo "=== $rung: warm-up copied from $cache" | tee -a "$log"
  elif [ ! -e "$sft_dir/sft_meta.json" ]; then
    XLA_FLAGS= step "warmup_$rung" "${WARMUP_SECONDS:-1800}" python tools/measure_usage.py "$dir/usage_warmup.json" \
      -m experiments.sft --preset "$rung" "${sft_args[@]}"
    [ -e "$sft_dir/sft_meta.json" ] && mkdir -p "$(dirname "$cache")" && rm -rf "$cache" && cp -r "$sft_dir" "$cache"
  fi
  ladder_pack "$rung" "$sft_dir"
  [ -e "$sft_dir/sft_meta.json" ] || return 1
  local sha
  sha=$(python -c "import json; print(json.load(open('$sft_dir/sft_meta.json'))['params_sha256'])")
  echo "=== $rung: warm-up params_sha256 $sha" | tee -a "$log"
  if [ -n "${WARMUP_SHA256:-}" ] && [ "$sha" != "$WARMUP_SHA256" ]; then
    echo "=== $rung: the warm-up is not the recorded one ($WARMUP_SHA256): not measured" | tee -a "$log"; return 1
  fi
  if ! step "band_$rung" 120 python -m experiments.band "$sft_dir" --table "$dir/band.md"; then
    echo "=== $rung: its warm-up lies outside the RL band ($dir/band.md); not measured" | tee -a "$log"
    ladder_pack "$rung" "$sft_dir"; return 0
  fi
  for recipes in $parts; do
    n=$((n + 1))
    case ",${LADDER_PARTS:-$n}," in *",$n,"*) ;; *) continue ;; esac
    if [ -f "$dir/gradients/part$n/gradients.json" ]; then echo "=== $rung part $n: measured earlier" | tee -a "$log"; continue; fi
    # shellcheck disable=SC2086  # GRAD_ARGS are words
    step "gradients_${rung}_part$n" "${GRAD_SECONDS:-3000}" python tools/measure_usage.py "$dir/usage_part$n.json" \
      -m experiments.gradients --preset "$rung" --init="$sft_dir" --recipes="$recipes" \
      --rollouts_file="$dir/gradients/rollouts.npz" --out="$dir/gradients/part$n" ${GRAD_ARGS:-}
    [ -d "$dir/gradients/part$n" ] && tar czf "$OUT/ladder_${rung}_part$n.tgz" --exclude=checkpoint "$dir/gradients/part$n"
    ladder_pack "$rung" "$sft_dir"
  done
  [ -f "$dir/gradients/rollouts.npz" ] && tar czf "$OUT/ladder_${rung}_rollouts.tgz" "$dir/gradients/rollouts.npz"
  return 0
}
ladder_pack() {  # ladder_pack RUNG SFT_DIR: the rung's small files into $OUT/ladder_RUNG.tgz
  cp "$log" "runs/$1/log.txt"
  # shellcheck disable=SC2046  # the files that exist
  tar czf "$OUT/ladder_$1.tgz" $(ls "runs/$1"/*.json "runs/$1"/*.md "runs/$1/log.txt" "$2"/*.json "$2"/*.md 2>/dev/null)
}
# Compiled programs from an earlier machine: the pieces of jax_cache.tgz that EXPORT_JAX_CACHE=1 left in that
# call's $OUT, laid in the carried folder JAX_CACHE_IN (.jax_cache/); XLA then loads what it would compile
# (a matrix arm's first step: a minute or more of a 10-minute call).
cache_in=${JAX_CACHE_IN:-.jax_cache}
if ls "$cache_in"/jax_cache.tgz.* >/dev/null 2>&1; then
  mkdir -p "$JAX_COMPILATION_CACHE_DIR" && cat "$cache_in"/jax_cache.tgz.* | tar xzf - -C "$JAX_COMPILATION_CACHE_DIR" \
    && echo "=== jax cache: $(find "$JAX_COMPILATION_CACHE_DIR" -type f | wc -l) files carried in" | tee -a "$log"
fi
# `gradients` measures on the committed batches, kept out of the tracked tree (results/data_files.json): without
# them (nor the copy an earlier call left on this machine) it is refused before any mode runs.
GRAD_ROLLOUTS=results/gradients_h200/parts/rollouts.npz
for mode in "${@:-bench}"; do
  if [ "$mode" = gradients ] && [ ! -f runs/h200/gradients/rollouts.npz ] && [ ! -f $GRAD_ROLLOUTS ]; then
    echo "gradients: $GRAD_ROLLOUTS is absent: run \`python tools/data_files.py fetch\` before the device call" \
      "and carry it (carry: [\"$GRAD_ROLLOUTS\"]); it is ignored by git, so only a carried path travels" | tee -a "$log"
    exit 1
  fi
done
python -c "import jax; print(jax.devices())" >>"$log" 2>&1
for mode in "${@:-bench}"; do
case "$mode" in
  check)
    # one step per suite, no -x: a failure in one backend must not hide the others' results.
    # Ordered by what a short device call must not miss: the default kernel, the model, the
    # benchmark; the Mosaic suite (slow to compile) gets what is left of SESSION_SECONDS.
    triton_tests 150
    model_tests "${MODEL_SECONDS:-300}"
    step bench_quant 220 python -m experiments.bench_quant --iters=10 ${BENCH_ARGS:-}
    mosaic_tests 200
    mkdir -p benchmarks/logs && cp "$log" benchmarks/logs/gpu_check.log
    tar czf "$OUT/benchmarks.tgz" benchmarks
    ;;
  tune)
    [ -n "${SKIP_REFERENCE_CHECK:-}" ] || step reference_check 60 python tools/check_gpu_reference.py
    step tune_quant "${TUNE_SECONDS:-300}" python -m experiments.tune_quant --iters=10 ${TUNE_ARGS:-}
    tar czf "$OUT/benchmarks.tgz" benchmarks
    ;;
  diagnose)
    JAX_LOG_COMPILES=1 model_tests "${MODEL_SECONDS:-300}"  # names each slow XLA compile
    mosaic_tests "${MOSAIC_SECONDS:-200}"
    mkdir -p benchmarks/logs && cp "$log" benchmarks/logs/gpu_diagnose.log
    tar czf "$OUT/benchmarks.tgz" benchmarks
    ;;
  bench)
    step kernels_gpu 150 python -m pytest -q -m gpu -x tests/kernels -p no:cacheprovider
    step bench_quant 200 python -m experiments.bench_quant --iters=10
    step bench_experts 180 python -m experiments.bench_experts
    step bench_memory 60 python -m experiments.bench_qlinear_memory
    step bench_decode 90 python -m experiments.bench_decode
    tar czf "$OUT/benchmarks.tgz" benchmarks
    ;;
  grouped)
    gemm_tests_and_bench grouped "tests/kernels/test_grouped_gemm.py tests/kernels/test_packed_ragged_dot.py" \
      "${GROUPED_SECONDS:-300}" bench_experts 480
    ;;
  weight_gemm)
    gemm_tests_and_bench weight_gemm "tests/kernels/test_packed_weight_gemm.py tests/kernels/test_wgmma_nvfp4.py" \
      "${GROUPED_SECONDS:-180}" bench_weight_gemm 300
    ;;
  packed_kernels)
    # the Mosaic packed-NVFP4 kernels of expert_gemm="packed_wgmma" in one call: compiled tests, the decode-size
    # and the training-size GEMM benchmarks beside the bf16 kernels, then decode throughput per backend
    step gpu_tests_packed_kernels "${PACKED_TESTS_SECONDS:-150}" python -m pytest -v -rf --tb=short -m gpu \
      tests/kernels/test_wgmma_nvfp4.py tests/kernels/test_packed_ragged_dot.py -p no:cacheprovider
    step gpu_tests_packed_wgmma_qdot 60 python -m pytest -v -rf --tb=short -m gpu tests/kernels/test_grouped_gemm.py \
      -k wgmma -p no:cacheprovider
    step bench_weight_gemm "${WEIGHT_GEMM_SECONDS:-150}" python -m experiments.bench_weight_gemm --shapes=experts128 \
      --rows_per_expert=1,8,64 --block_n=64,128 --block_k=128,256
    step bench_experts "${EXPERTS_SECONDS:-120}" python -m experiments.bench_experts --gemms=xla,mosaic,packed,packed_wgmma
    step bench_decode "${DECODE_SECONDS:-100}" python -m experiments.bench_decode --recipes=bf16,full \
      --expert_gemms=packed,packed_wgmma
    mkdir -p benchmarks/logs && cp "$log" benchmarks/logs/gpu_packed_kernels.log
    tar czf "$OUT/benchmarks.tgz" benchmarks
    ;;
  wgmma_sass)
    # Where the WGMMA decode kernel's time goes: its compiled tests (both decodes), its SASS and resources at the
    # benchmark's fastest shape (Mosaic GPU's dumps, tarred; `python tools/mosaic_sass.py mosaic_dump.tgz --kernel
    # fp4rl_grouped_nvfp4_wgmma --per_step_elements 16384` counts a K step), a wider launch-shape sweep (programs of
    # 64 and 128 output features among them), then
    # packed_wgmma inside qdot and the sampler with every XLA compile logged (JAX_LOG_COMPILES), long enough to
    # tell a slow compile from a hang
    step gpu_tests_wgmma 120 python -m pytest -v -rf --tb=short -m gpu tests/kernels/test_wgmma_nvfp4.py -p no:cacheprovider
    MOSAIC_GPU_DUMP_SASS=1 MOSAIC_GPU_DUMP_RESOURCES=1 MOSAIC_GPU_DUMP_TO="$OUT/mosaic_dump" step wgmma_sass 120 \
      python -m experiments.bench_weight_gemm --shapes=experts128 --rows_per_expert=8 --block_m=16 --block_n=128 \
      --block_k=256 --wgmma_rows=8 --out=/tmp/bench_sass
    tar czf "$OUT/mosaic_dump.tgz" -C "$OUT" mosaic_dump && rm -rf "$OUT/mosaic_dump"
    step bench_weight_gemm_wgmma "${WEIGHT_GEMM_SECONDS:-200}" python -m experiments.bench_weight_gemm \
      --shapes=experts128 --rows_per_expert=1,8,64 --block_n=128 --block_k=128,256 --wgmma_rows=8,64 \
      --wgmma_stages=2,4 --wgmma_block_n=64,128 --out=/tmp/bench_wgmma_sweep
    JAX_LOG_COMPILES=1 step gpu_tests_packed_wgmma_qdot 150 python -m pytest -v -s --durations=0 -rf --tb=short -m gpu \
      tests/kernels/test_grouped_gemm.py -k wgmma -p no:cacheprovider
    JAX_LOG_COMPILES=1 step bench_decode_wgmma "${DECODE_SECONDS:-200}" python -m experiments.bench_decode \
      --recipes=full --expert_gemms=packed_wgmma,packed --out=/tmp/bench_decode_wgmma
    mkdir -p benchmarks/logs && cp "$log" benchmarks/logs/gpu_wgmma_sass.log
    tar czf "$OUT/benchmarks.tgz" benchmarks
    ;;
  triton)
    triton_tests "${TRITON_SECONDS:-150}"
    ;;
  mosaic)
    mosaic_tests "${MOSAIC_SECONDS:-200}"
    ;;
  model)
    model_tests "${MODEL_SECONDS:-300}"
    ;;
  sampler)
    # the rollout program's loop structure (decode chunks, the stop test shared over seeds) keeps
    # every output byte, compiled (SAMPLER_TESTS: a -k selection, both recipes by default)
    step gpu_tests_sampler "${SAMPLER_SECONDS:-300}" python -m pytest -v -s -rf --tb=short -m gpu \
      tests/model/test_gpu_sampler.py -k "${SAMPLER_TESTS:-bf16 or full}" -p no:cacheprovider
    mkdir -p benchmarks/logs && cp "$log" benchmarks/logs/gpu_tests_sampler.log
    ;;
  decode)
    # decode throughput per recipe, then one profiled call each: where a decode step's time goes
    step bench_decode "${DECODE_SECONDS:-500}" python -m experiments.bench_decode --recipes=bf16,full \
      --expert_gemms="${DECODE_GEMMS:-xla,mosaic,packed}" --profile=runs/decode_trace ${BENCH_ARGS:-}
    tar czf "$OUT/benchmarks.tgz" benchmarks
    ;;
  quant)
    step bench_quant "${BENCH_SECONDS:-200}" python -m experiments.bench_quant --iters=10 ${BENCH_ARGS:-}
    tar czf "$OUT/benchmarks.tgz" benchmarks
    ;;
  probe)
    PYTHONPATH=.:${PYTHONPATH:-} step mosaic_probe "${PROBE_SECONDS:-120}" python tools/mosaic_probe.py ${PROBE_ARGS:-}
    mkdir -p benchmarks/logs && cp "$log" benchmarks/logs/gpu_probe.log
    tar czf "$OUT/benchmarks.tgz" benchmarks
    ;;
  pilot)
    # The learning-rate pilot (docs/rl.md): bf16 at each LR of PILOT_LRS (the first run trains the warm-up, the others
    # copy it), then nvfp4 and full at the largest LR where bf16 was stable (fp4rl.analysis.lr_sweep).
    steps=${PILOT_STEPS:-30}
    export JAX_COMPILATION_CACHE_DIR=/tmp/jax_cache  # the sweep's runs share their forward programs
    first=""
    for lr in ${PILOT_LRS:-1e-4 3e-4}; do
      dir=runs/pilot/lr$lr
      if [ -n "$first" ] && [ ! -e "$dir/sft" ]; then mkdir -p "$dir" && cp -r "$first/sft" "$dir/sft"; fi
      limit=$([ -z "$first" ] && echo "${PILOT_FIRST_SECONDS:-230}" || echo "${PILOT_BF16_SECONDS:-110}")
      step "bf16_lr$lr" "$limit" python -m experiments.ablation --preset h200 --arms=bf16 --seeds=2 \
        --rl.steps="$steps" --rl.optim.lr="$lr" --out="$dir"
      first=${first:-$dir}
    done
    dir=$(python -m experiments.lr_sweep runs/pilot/lr* 2>>"$log") || dir=runs/pilot/lr3e-5
    lr=${dir##*/lr}
    echo "=== chosen: $dir (lr $lr)" | tee -a "$log"
    if [ ! -e "$dir/sft" ]; then mkdir -p "$dir" && cp -r "$first/sft" "$dir/sft"; fi
    # impl=auto: the Triton quantizers. Should they fail inside the model, the log says so and the
    # arms rerun with the jnp reference (an explicit, logged second attempt, not a silent fallback).
    step arms "${PILOT_ARMS_SECONDS:-330}" python -m experiments.ablation --preset h200 --arms="${PILOT_ARMS:-bf16,nvfp4,full}" --seeds=2 \
      --rl.steps="$steps" --rl.optim.lr="$lr" --rl.impl=auto --out="$dir" \
      || { grep -q "Traceback" "$log" && step arms_reference "${PILOT_RETRY_SECONDS:-200}" python -m experiments.ablation \
           --preset h200 --arms="${PILOT_ARMS:-bf16,nvfp4,full}" --seeds=2 --rl.steps="$steps" --rl.optim.lr="$lr" --rl.impl=reference --out="$dir"; }
    cp "$log" runs/pilot/log.txt
    tar czf "$OUT/pilot.tgz" --exclude=checkpoint --exclude=tb --exclude=.jax_cache runs/pilot
    ;;
  learn)
    # The deterministic warm-up (experiments set --xla_gpu_deterministic_ops; sft_meta.json records
    # the parameters' SHA-256), then bf16 RL with held-out evaluations and the learning verdict.
    warmup
    step rl_bf16 "${RL_SECONDS:-420}" python -m experiments.rl --preset h200 --arm bf16 --seeds 2 ${RL_ARGS:-}
    step learning 30 python -m experiments.learning runs/h200/rl/bf16
    cp "$log" runs/h200/log.txt
    tar czf "$OUT/learn.tgz" --exclude=checkpoint --exclude=tb --exclude=.jax_cache runs/h200
    ;;
  long)
    # The long-horizon task's bar (docs/rl.md "Task"): bf16 RL from the h200-long warm-up keeps raising
    # held-out sampled accuracy through 300 steps. Resumable: a rerun continues from the last checkpoint.
    WARMUP_SECONDS=${WARMUP_SECONDS:-420} warmup h200-long || exit 1
    step rl_long "${RL_SECONDS:-2400}" python -m experiments.rl --preset h200-long --arm bf16 --seeds 2 \
      --expert_gemm="${LONG_GEMM:-packed}" ${RL_ARGS:-}
    step learning 60 python -m experiments.learning runs/h200-long/rl/bf16 --window=150:300 --reward_cap=0.8@150
    cp "$log" runs/h200-long/log.txt
    tar czf "$OUT/long.tgz" --exclude=checkpoint --exclude=tb --exclude=.jax_cache runs/h200-long
    ;;
  bands)
    # Each band in its own pipeline, all at once: the warm-up (its digest printed), the band check, and
    # RL on a warm-up inside the band; the processes allocate on demand (no share of the memory each).
    # The first lines check the `auto` expert GEMM on this GPU: what it resolves to, and the model's
    # compiled training step (Triton quantizer == reference, bit for bit; packed GEMMs).
    python -c "from fp4rl.model.config import ModelConfig as M; print('=== auto expert GEMM on h200:', M.from_name('h200').resolved().expert_gemm)" 2>&1 | tee -a "$log"
    bands=${BANDS:-h200-long-x4 h200-chain}
    band_pipeline() {  # band_pipeline PRESET
      WARMUP_SECONDS=${WARMUP_SECONDS:-900} warmup "$1" || return 1
      python -m experiments.band "runs/$1/sft" --table="runs/$1/band.md" >>"$log" 2>&1 \
        || { echo "=== band $1: warm-up outside the band, no RL" | tee -a "$log"; return 0; }
      step "rl_$1" "${RL_SECONDS:-2400}" python -m experiments.rl --preset "$1" --arm bf16 --seeds 2 --expert_gemm=packed \
        ${RL_ARGS:-}
      step "learning_$1" 60 python -m experiments.learning "runs/$1/rl/bf16" --window=150:300 --reward_cap=0.8@150
    }
    for band in $bands; do band_pipeline "$band" & sleep 10; done
    [ "${BAND_MODEL_TESTS:-1}" = 1 ] && model_tests 600
    wait
    cp "$log" runs/bands_log.txt
    # shellcheck disable=SC2046  # one path per band
    tar czf "$OUT/bands.tgz" --exclude=checkpoint --exclude=tb --exclude=.jax_cache runs/bands_log.txt \
      $(for band in $bands; do echo "runs/$band"; done)
    ;;
  arms)
    # The RL matrix a few arms per call (a call holds the warm-up and about one arm of 4 seeds x 100
    # steps): each finished arm's metrics come back; the checkpoints stay on the machine.
    warmup
    [ -e runs/h200/ablation/sft ] || { mkdir -p runs/h200/ablation && cp -r runs/h200/sft runs/h200/ablation/sft; }
    step ablation "${ABLATION_SECONDS:-560}" python -m experiments.ablation --preset h200 --arms="${ARMS:-bf16}" \
      --seeds="${SEEDS:-4}" ${ABLATION_ARGS:-}
    cp "$log" runs/h200/log.txt
    tar czf "$OUT/arms.tgz" --exclude=checkpoint --exclude=tb --exclude=.jax_cache runs/h200
    ;;
  matrix)
    # The RL matrix, PARALLEL arms at a time per GPU, one process each, so that arms' compilations and host-side
    # work overlap (nvidia_smi.csv records what the GPU did meanwhile). XLA plans each program for its
    # process's share of the memory and rematerializes one that needs more, which is slow to compile:
    # PARALLEL=1 for programs over ~40 GiB (4 seeds on the `xla` grouped GEMM); at 2 seeds two fit
    # (three did not: an update program asked for 33.9 GiB of its 31.7%). The runs live
    # outside the carried tree (MATRIX_DIR), so a call on a machine still warm resumes the arms the
    # previous one cut (the trainer checkpoints every --rl.checkpoint_every steps); finished arms
    # (done.json) are skipped. Every arm's metrics, finished or not, and each process's console log
    # (arm_ARM.log in its job's folder) come back in matrix.tgz: a call returns at most 8 files, so
    # the files beside it (log, GPU trace, compiled programs) stay few however many jobs run.
    # A checkpoint every CHECKPOINT_EVERY steps (100: a 4-seed h200-chain checkpoint takes ~10 s to
    # write, and one every 20 steps cost 13% of an arm's time; a cut arm resumes only while the same
    # machine is held, which a session's end does not outlast).
    preset=${MATRIX_PRESET:-h200}
    warmup "$preset" || exit 1
    # The committed matrices' runs lowered jax.random's draws with XLA's rounds: their later runs keep those programs
    # (the same StableHLO, and the carried compilation caches still hit), not the threefry kernel the entry points ask for.
    export JAX_THREEFRY_GPU_KERNEL_LOWERING=${JAX_THREEFRY_GPU_KERNEL_LOWERING:-0}
    dir=${MATRIX_DIR:-/tmp/fp4rl-matrix}
    parallel=${PARALLEL:-2}
    # each process may grow to its share of the GPU's memory (allocation on demand, see above)
    export XLA_PYTHON_CLIENT_MEM_FRACTION=$(python -c "print(round(0.95 / $parallel, 3))")
    nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv -l 15 >"$OUT/nvidia_smi.csv" 2>&1 &
    smi=$!
    disown $smi
    # MPS=1: the jobs' processes share the GPU through CUDA MPS, whose kernels run side by side, instead of
    # time-slicing between contexts (a 2-seed job's sampler launches small kernels that leave most SMs idle;
    # nvidia-smi's utilization counts a time slice busy however few SMs work). Same kernels, same numerics.
    [ "${MPS:-0}" = 1 ] && mps_start "$dir"
    deadline=$(( START + ${SESSION_SECONDS:-575} - 25 ))
    # A job is ARM or ARM:FIRST_SEED. ARM:FIRST_SEED runs seeds FIRST.. (--rl.seed_offset) in a folder of its own,
    # $MATRIX_DIR/seedsFIRST (merge it with `experiments.merge_seeds $MATRIX_DIR/seedsFIRST ...`), so that one call
    # on a machine of several GPUs runs several 2-seed runs of the plan, of one arm or of several.
    job_dir() { case "$1" in *:*) echo "$dir/seeds${1#*:}" ;; *) echo "$dir" ;; esac; }
    run_arm() {  # run_arm JOB GPU: until it finishes or the call's deadline
      local arm=${1%%:*} out offset="" left=$(( deadline - $(date +%s) ))
      out=$(job_dir "$1")
      case "$1" in *:*) offset="--rl.seed_offset=${1#*:}" ;; esac
      [ -e "$out/sft/sft_meta.json" ] || { mkdir -p "$out" && rm -rf "$out/sft" && cp -r "runs/$preset/sft" "$out/sft"; }
      echo "=== arm $1 on GPU $2 (limit ${left}s) $(date +%T)" | tee -a "$log"
      CUDA_VISIBLE_DEVICES=$2 timeout "$left" python -m experiments.ablation --preset "$preset" --arms="$arm" --seeds="${SEEDS:-4}" \
        --out="$out" --rl.checkpoint_every="${CHECKPOINT_EVERY:-100}" ${ABLATION_ARGS:-} $offset >>"$out/arm_${arm//+/plus}.log" 2>&1
      echo "=== arm $1 rc=$? $(date +%T)" | tee -a "$log"
    }
    gpu_queue() {  # gpu_queue GPU JOB...: this GPU's jobs, PARALLEL at a time
      local gpu=$1; shift
      for job in "$@"; do
        while [ "$(jobs -rp | wc -l)" -ge "$parallel" ]; do sleep 5; done
        [ $(( deadline - $(date +%s) )) -gt 60 ] || { echo "=== GPU $gpu: arm $job and the rest skipped: no time left" | tee -a "$log"; break; }
        run_arm "$job" "$gpu" &
        sleep "${STAGGER_SECONDS:-20}"  # staggered: the processes' compilations overlap less
      done
      wait
    }
    # The jobs not finished yet, dealt round-robin to the GPUs (a multi-GPU machine runs PARALLEL per GPU).
    gpus=$(nvidia-smi -L 2>/dev/null | grep -c "^GPU")
    [ "$gpus" -ge 1 ] || gpus=1
    todo=()
    for job in ${ARMS//,/ }; do
      if [ -f "$(job_dir "$job")/${job%%:*}/done.json" ]; then echo "=== arm $job: finished earlier" | tee -a "$log"; else todo+=("$job"); fi
    done
    for gpu in $(seq 0 $((gpus - 1))); do
      mine=()
      for i in "${!todo[@]}"; do [ $((i % gpus)) -eq "$gpu" ] && mine+=("${todo[$i]}"); done
      [ ${#mine[@]} -gt 0 ] && gpu_queue "$gpu" "${mine[@]}" &
    done
    wait
    kill "$smi" 2>/dev/null
    [ "${MPS:-0}" = 1 ] && mps_stop "$dir"
    cp "$log" "$dir/log_$(date +%H%M%S).txt"
    tar czf "$OUT/matrix.tgz" -C "$dir" --exclude=checkpoint --exclude=tb --exclude=.jax_cache .
    ;;
  compile)
    # each XLA_FLAGS variant in its own process (XLA reads XLA_FLAGS at start), all at once (compiling
    # is CPU work): the default, no autotuning, cuBLAS instead of Triton GEMMs
    i=0
    for flags in "" "--xla_gpu_autotune_level=0" "--xla_gpu_enable_triton_gemm=false"; do
      i=$((i + 1))
      XLA_PYTHON_CLIENT_MEM_FRACTION=0.3 XLA_FLAGS="$flags" step "compile ${flags:-default}" "${COMPILE_SECONDS:-240}" \
        python tools/compile_time.py update h200 "${COMPILE_ARMS:-bf16}" "${SEEDS:-4}" "${COMPILE_GEMMS:-blocked,xla}" &
      sleep 1
    done
    wait
    grep "compile " "$log"
    # the fastest variant for the first backend of COMPILE_GEMMS, as shell assignments a later call
    # sources (COMPILE_CHOICE); none finished: the portable `xla` backend with the default flags
    python - "$log" "${COMPILE_GEMMS:-blocked,xla}" >"${COMPILE_CHOICE:-/tmp/fp4rl-compile-choice.sh}" <<'PY'
import re, shlex, sys
gemm = sys.argv[2].split(",")[0]
times = [(float(m[1]), "" if m[2] == "default XLA_FLAGS" else m[2])
         for m in re.finditer(rf"gemm {gemm} +compile +([0-9.]+) s \((.*)\)", open(sys.argv[1]).read())]
seconds, flags = min(times) if times else (None, "")
print(f"export GEMM={gemm if times else 'xla'} XLA_FLAGS={shlex.quote(flags)} COMPILE_SECONDS_MEASURED={seconds}")
PY
    tee -a "$log" <"${COMPILE_CHOICE:-/tmp/fp4rl-compile-choice.sh}"
    ;;
  threefry)
    # jax.random's threefry draws lowered to JAX's CUDA kernel (fp4rl.formats.stochastic): the same bytes compiled,
    # then the update program of COMPILE_ARMS compiled with XLA's lowering and with the kernel, at once
    # (two processes, no compilation cache)
    step gpu_tests_threefry 120 python -m pytest -v -rf --tb=short -m gpu tests/formats/test_stochastic.py -p no:cacheprovider
    for kernel in 0 1; do
      JAX_ENABLE_COMPILATION_CACHE=false JAX_THREEFRY_GPU_KERNEL_LOWERING=$kernel XLA_PYTHON_CLIENT_MEM_FRACTION=0.3 \
        step "compile threefry kernel $kernel" "${COMPILE_SECONDS:-240}" \
        python tools/compile_time.py update h200 "${COMPILE_ARMS:-nvfp4-pt}" "${SEEDS:-4}" "${COMPILE_GEMMS:-packed}" &
      sleep 1
    done
    wait
    grep "compile " "$log"
    mkdir -p benchmarks/logs && cp "$log" benchmarks/logs/gpu_threefry.log
    tar czf "$OUT/benchmarks.tgz" benchmarks
    ;;
  division)
    # Under IEEE_GPU_DIVISION fp4rl.formats.ieee.divide divides natively on the GPU instead of by integer long
    # division (~half of a quantized arm's update program). Decisive: every oracle row at 0 mismatches with the
    # flag, and the compiled tests passing with it; then the compile times say what it buys.
    ieee=--xla_backend_extra_options=-nvptx-prec-divf32=3
    XLA_FLAGS=$ieee step reference_check_ieee_division 90 python tools/check_gpu_reference.py
    XLA_FLAGS=$ieee step gpu_tests_ieee_division 150 python -m pytest -v -rf --tb=short -m gpu \
      tests/kernels/test_stochastic_quant.py tests/formats/test_stochastic.py -p no:cacheprovider
    [ -n "${DIVISION_MODEL_TESTS:-}" ] && XLA_FLAGS=$ieee model_tests "${MODEL_SECONDS:-300}"
    for flags in "" "$ieee"; do
      JAX_ENABLE_COMPILATION_CACHE=false XLA_FLAGS="$flags" XLA_PYTHON_CLIENT_MEM_FRACTION=0.45 \
        step "compile ${flags:-default}" "${COMPILE_SECONDS:-300}" \
        python tools/compile_time.py update h200 "${COMPILE_ARMS:-nvfp4-pt,full}" "${SEEDS:-4}" "${COMPILE_GEMMS:-packed}" \
        "${COMPILE_PROGRAMS:-update,sample}" &
      sleep 1
    done
    wait
    grep -E "compile |vs oracle|reference division" "$log"
    mkdir -p benchmarks/logs && cp "$log" benchmarks/logs/gpu_division.log
    tar czf "$OUT/benchmarks.tgz" benchmarks
    ;;
  rlstep)
    # RL step time per arm x grouped-GEMM backend from the preset's warm-up (RLSTEP_PRESET, h200 by
    # default; h200-chain is the matrix's), one run after the other
    # (RLSTEP_ARGS="--profile=runs/rlstep_trace": the last step of each run profiled, its kernels tabled)
    preset=${RLSTEP_PRESET:-h200}
    warmup "$preset" || exit 1
    # shellcheck disable=SC2086  # RLSTEP_ARGS are words
    step rl_step_time "${RLSTEP_SECONDS:-540}" python tools/rl_step_time.py --preset "$preset" --init "runs/$preset/sft" \
      --arms "${ARMS:-bf16,full}" --seeds "${SEEDS:-2}" --gemms "${GEMMS:-xla,mosaic,packed}" --steps "${STEPS:-6}" --out benchmarks ${RLSTEP_ARGS:-}
    mkdir -p benchmarks/logs && cp "$log" benchmarks/logs/gpu_rl_step_time.log
    tar czf "$OUT/benchmarks.tgz" benchmarks
    ;;
  warmup)
    warmup "${WARMUP_PRESET:-h200}"
    ;;
  sftstep)
    # one process per variant (XLA reads XLA_FLAGS at start), one after the other (they would share the GPU)
    preset=${SFTSTEP_PRESET:-h200-long}
    det=--xla_gpu_deterministic_ops=true
    XLA_FLAGS=$det step sftstep_packed_det 240 python tools/sft_step_time.py --preset "$preset" --gemm packed --profile /tmp/sftstep_trace
    XLA_FLAGS= step sftstep_packed 180 python tools/sft_step_time.py --preset "$preset" --gemm packed
    XLA_FLAGS=$det step sftstep_xla_det 180 python tools/sft_step_time.py --preset "$preset" --gemm xla
    XLA_FLAGS=$det step sftstep_packed_det_b256 180 python tools/sft_step_time.py --preset "$preset" --gemm packed --batch_size 256
    grep '"step_s"' "$log" >"$OUT/sft_step_time.jsonl"
    ;;
  serve_eval)
    warmup
    step serve_eval "${SERVE_SECONDS:-560}" python -m experiments.serve_eval --preset h200 ${SERVE_ARGS:-}
    cp "$log" runs/h200/log.txt
    tar czf "$OUT/serve_eval.tgz" --exclude=checkpoint runs/h200/serve_eval runs/h200/log.txt
    ;;
  gradients)
    warmup
    dir=runs/h200/gradients && mkdir -p runs/h200/gradients
    # the committed batches, so that every part is measured on the same ones (gradient_store; carried in, above)
    [ -f $dir/rollouts.npz ] || cp $GRAD_ROLLOUTS $dir/
    step gradients "${GRAD_SECONDS:-330}" python -m experiments.gradients --preset h200 \
      --rollouts_file=$dir/rollouts.npz --out="$dir/${GRAD_PART:-all}" ${GRAD_ARGS:-}
    cp "$log" "$dir/${GRAD_PART:-all}.log" && cp runs/h200/sft/sft_meta.json "$dir/warmup_meta.json"
    tar czf "$OUT/gradients.tgz" "$dir"
    ;;
  ladder)
    # The model-size ladder (`experiments.scaling`; docs/rl.md "Model-size ladder"). LADDER lists the rungs
    # (configs.SCALING_LADDER by default), each measured by `ladder_rung` below.
    ladder=${LADDER:-$(python -c "from fp4rl import configs; print(','.join(configs.SCALING_LADDER))")}
    for rung in ${ladder//,/ }; do
      ladder_rung "$rung"
    done
    ;;
  hf)
    # The paper's path compiled: a local Qwen3-MoE of ~320M parameters (fp4rl.model.hf_local: random
    # weights, its own BPE tokenizer and chat template, 8k positions) and 512 DAPO-Math-style rows, RL
    # with the `hf` preset's shapes (32 prompts x 16, 1k prompt + 7k response tokens, remat, chunked
    # attention, 16 micro-batches) on one GPU; metrics (time/step_s, memory/peak_gb) come back in hf.tgz.
    # At 8k tokens a step is tens of seconds and compiling minutes: start it detached
    # (HF_STEPS=3 MODE=hf tools/long_horizon_call.sh).
    dir=runs/hf
    step hf_checkpoint 240 python -m experiments.hf_local $dir/qwen3_300m --size=300m \
      --rows=$dir/rows.jsonl --num_rows=512 || exit 1
    # shellcheck disable=SC2086  # HF_ARGS are words
    step hf_rl "${HF_SECONDS:-1500}" python -m experiments.rl --preset hf --model.hf=$dir/qwen3_300m \
      --rl.data_file=$dir/rows.jsonl --rl.steps="${HF_STEPS:-4}" --rl.out=$dir/rl ${HF_ARGS:-}
    cp "$log" $dir/log.txt
    tar czf "$OUT/hf.tgz" --exclude=checkpoint --exclude=tb $dir/rl $dir/log.txt $dir/qwen3_300m/config.json
    ;;
  *)
    # the modes are this script's case labels
    modes=$(grep -oE '^  [a-z_]+\)$' "${BASH_SOURCE[0]}" | tr -d ' )' | paste -sd, - | sed 's/,/, /g')
    echo "unknown mode '$mode': choose from $modes" | tee -a "$log"; exit 2
    ;;
esac
done
# The compiled programs back to this machine (EXPORT_JAX_CACHE=1), in pieces under the device's 16 MiB a file
# and at most 45 MiB in all (what a call can carry beside .whl); carry them as JAX_CACHE_IN next time.
if [ -n "${EXPORT_JAX_CACHE:-}" ] && [ -d "$JAX_COMPILATION_CACHE_DIR" ]; then
  tar czf /tmp/jax_cache.tgz -C "$JAX_COMPILATION_CACHE_DIR" .
  size=$(stat -c %s /tmp/jax_cache.tgz)
  if [ "$size" -le $((45 * 1024 * 1024)) ]; then
    split -b 15M -d /tmp/jax_cache.tgz "$OUT/jax_cache.tgz." && echo "=== jax cache: $size bytes to \$OUT" | tee -a "$log"
  else
    echo "=== jax cache: $size bytes, over 45 MiB: not exported" | tee -a "$log"
  fi
fi
