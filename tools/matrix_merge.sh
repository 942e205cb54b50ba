#!/usr/bin/env bash
# After a `gpu_session.sh matrix` call: merge its finished runs into the committed matrix and refresh
# what is generated from it, in one step.
#   bash tools/matrix_merge.sh FILES_AT [MATRIX]
# FILES_AT: the folder the device call's files came back to (matrix.tgz, log.txt, nvidia_smi.csv).
# MATRIX: results/long_h200/chain/paired by default. WARMUP_SHA256: the warm-up digest the call checked
# (the chain's by default). Each finished run (a job ARM:FIRST's folder seedsFIRST, or an arm at the top
# of the tarball) joins MATRIX/ARM with `experiments.merge_seeds`, the call's log and GPU trace beside it
# (log_seedsA-B.txt, nvidia_smi_seedsA-B.csv); then the seed logs are packed, and each merged arm's
# learning.md, the report and status.md are rewritten. A run that did not finish is named and left out.
set -euo pipefail
files=${1:?usage: bash tools/matrix_merge.sh FILES_AT [MATRIX]}
matrix=${2:-results/long_h200/chain/paired}
sha=${WARMUP_SHA256:-48007c4613c51b4392d063f37480712b2f9809bff77d35086905c751fe864c2c}
[ -f "$files/matrix.tgz" ] || { echo "no matrix.tgz in $files" >&2; exit 2; }
[ -d "$matrix" ] || { echo "no matrix directory $matrix" >&2; exit 2; }
work=$(mktemp -d /tmp/fp4rl-matrix-merge-XXXXXX)
tar xzf "$files/matrix.tgz" -C "$work"
merged=()
for run in "$work" "$work"/seeds*; do
  [ -d "$run" ] || continue
  for arm_dir in "$run"/*/; do
    arm=$(basename "$arm_dir")
    case "$arm" in sft|seeds*) continue ;; esac
    if [ ! -f "$arm_dir/done.json" ]; then echo "=== $arm in $(basename "$run"): not finished, left out"; continue; fi
    seeds=$(python -c "import json, sys; s = json.load(open(sys.argv[1]))['seeds']; print(f'{min(s)}-{max(s)}')" "$arm_dir/done.json")
    fresh=$([ -d "$matrix/$arm" ] && echo no || echo yes)
    python -m experiments.merge_seeds "$run" "$matrix" --arms "$arm" --warmup_sha256 "$sha"
    # a new arm is copied whole, with its own train.log: the call's log and trace sit beside it
    suffix=$([ "$fresh" = yes ] && echo "" || echo "_seeds$seeds")
    [ -f "$files/log.txt" ] && cp "$files/log.txt" "$matrix/$arm/log$suffix.txt"
    [ -f "$files/nvidia_smi.csv" ] && cp "$files/nvidia_smi.csv" "$matrix/$arm/nvidia_smi$suffix.csv"
    merged+=("$arm")
  done
done
rm -rf "$work"
[ ${#merged[@]} -gt 0 ] || { echo "nothing finished to merge" >&2; exit 1; }
python -m experiments.pack_logs "$matrix"
for arm in $(printf '%s\n' "${merged[@]}" | sort -u); do
  python -m experiments.learning "$matrix/$arm" --window=150:300 --reward_cap=0.8@150 >/dev/null
done
python -m experiments.report "$matrix" >/dev/null
python -m experiments.matrix_status "$matrix" --warmup_sha="$sha" --write "$matrix/status.md" >/dev/null
head -n 3 "$matrix/status.md"  # not piped: head closing the pipe early would fail the writer under pipefail
