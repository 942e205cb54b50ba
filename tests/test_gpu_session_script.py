"""tools/gpu_session.sh: a mistyped mode is refused with the list of the modes it has; the matrix and the
ladder modes run what they are asked, with stand-ins for python; the gradients mode is refused at once without
the untracked rollouts it measures on (fetched with tools/data_files.py and carried)."""

import json
import re
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "tools" / "gpu_session.sh"


def test_unknown_mode_names_every_mode(tmp_path):
    modes = re.findall(r"^  ([a-z_]+)\)$", SCRIPT.read_text(), flags=re.M)
    assert len(modes) > 10
    result = subprocess.run(["bash", str(SCRIPT), "no_such_mode"], cwd=tmp_path, env={"OUT": str(tmp_path / "out"),
                            "PATH": "/usr/bin:/bin"}, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    listed = result.stdout.split("choose from ", 1)[1].strip().split(", ")
    assert listed == modes


FAKE_PYTHON = """#!/bin/bash
# Stands in for python: records each ablation call and leaves the arm finished; anything else is a no-op.
if [ "$1 $2" = "-m experiments.ablation" ]; then
  echo "GPU=$CUDA_VISIBLE_DEVICES $*" >> "$CALLS"
  for a in "$@"; do case "$a" in --out=*) out=${a#--out=} ;; --arms=*) arm=${a#--arms=} ;; esac; done
  mkdir -p "$out/$arm" && echo '{"seeds": [0, 1]}' > "$out/$arm/done.json"
else
  cat >/dev/null 2>&1 || true
fi
"""


def _run_matrix(tmp_path, gpus: int, fakes: dict, **env) -> str:
    """`gpu_session.sh matrix` on the h200-chain preset with stand-ins for python and nvidia-smi (`gpus`
    GPUs) and the programs in `fakes`; the matrix in tmp_path/matrix, each ablation call in tmp_path/calls.txt.
    Its stdout. Called again, the same session runs again on what the first left."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    listing = "".join(f"GPU {i}: H200\\n" for i in range(gpus))
    for name, text in {"python": FAKE_PYTHON, "python3": FAKE_PYTHON,
                       "nvidia-smi": f'#!/bin/bash\n[ "$1" = -L ] && printf "{listing}"\n', **fakes}.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    sft = tmp_path / "work" / "runs" / "h200-chain" / "sft"
    sft.mkdir(parents=True, exist_ok=True)
    (sft / "sft_meta.json").write_text('{"params_sha256": "x"}')
    env = {"OUT": str(tmp_path / "out"), "PATH": f"{bin_dir}:/usr/bin:/bin", "CALLS": str(tmp_path / "calls.txt"),
           "STAGGER_SECONDS": "0", "MATRIX_PRESET": "h200-chain", "MATRIX_DIR": str(tmp_path / "matrix"), "SEEDS": "2",
           "WARMUP_CACHE": str(tmp_path / "no_cache"), **env}
    result = subprocess.run(["bash", str(SCRIPT), "matrix"], cwd=sft.parents[2], env=env, capture_output=True, text=True,
                            timeout=60, stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_matrix_jobs_with_a_first_seed_run_in_folders_of_their_own_across_the_gpus(tmp_path):
    jobs = {"ARMS": "full-dq:2,full-46:0,bf16", "PARALLEL": "1"}
    _run_matrix(tmp_path, 2, {}, **jobs)
    matrix, calls = tmp_path / "matrix", tmp_path / "calls.txt"
    lines = sorted(calls.read_text().splitlines())
    # round-robin over the two GPUs; a first seed becomes the run's seed offset and its folder
    assert any(l.startswith("GPU=0 ") and "--arms=full-dq" in l and f"--out={matrix}/seeds2 " in l
               and l.endswith("--rl.seed_offset=2") for l in lines), lines
    assert any(l.startswith("GPU=1 ") and "--arms=full-46" in l and f"--out={matrix}/seeds0 " in l
               and l.endswith("--rl.seed_offset=0") for l in lines), lines
    assert any(l.startswith("GPU=0 ") and "--arms=bf16" in l and f"--out={matrix} " in l
               and "seed_offset" not in l for l in lines), lines
    assert all((folder / "sft" / "sft_meta.json").is_file() for folder in (matrix, matrix / "seeds2", matrix / "seeds0"))
    # each job's console log travels in matrix.tgz, not as a file of its own beside it
    assert (matrix / "seeds2" / "arm_full-dq.log").is_file() and not list((tmp_path / "out").glob("arm_*"))
    assert (tmp_path / "out" / "matrix.tgz").is_file()
    # a second call skips the finished jobs
    calls.unlink()
    _run_matrix(tmp_path, 2, {}, **jobs)
    assert not calls.exists()
    assert "arm full-dq:2: finished earlier" in (tmp_path / "out" / "log.txt").read_text()


FAKE_MPS_CONTROL = """#!/bin/bash
# Stands in for nvidia-cuda-mps-control: -d starts "the daemon"; on stdin, get_server_list asks whether it runs
# and quit stops it. Every request is recorded.
if [ "${1:-}" = -d ]; then echo "-d pipes=$CUDA_MPS_PIPE_DIRECTORY" >> "$MPS_CALLS"; touch "$CUDA_MPS_PIPE_DIRECTORY/up"; exit 0; fi
read -r request; echo "$request" >> "$MPS_CALLS"
case "$request" in
  get_server_list) [ -e "$CUDA_MPS_PIPE_DIRECTORY/up" ] ;;
  quit) rm -f "$CUDA_MPS_PIPE_DIRECTORY/up" ;;
esac
"""


def _matrix_with_mps(tmp_path, control: bool):
    """Two jobs side by side with MPS=1 on one GPU, with or without the control program: (stdout,
    the requests the control program saw, the matrix folder)."""
    mps_calls = tmp_path / "mps_calls.txt"
    stdout = _run_matrix(tmp_path, 1, {"nvidia-cuda-mps-control": FAKE_MPS_CONTROL} if control else {},
                         ARMS="full-dq:2,full-46:0", PARALLEL="2", MPS="1", MPS_DIR=str(tmp_path / "mps"),
                         MPS_CALLS=str(mps_calls))
    assert len((tmp_path / "calls.txt").read_text().splitlines()) == 2  # both jobs ran, with or without MPS
    return stdout, (mps_calls.read_text().splitlines() if mps_calls.exists() else []), tmp_path / "matrix"


def test_mps_serves_the_matrix_jobs_and_is_stopped_after_them(tmp_path):
    stdout, requests, matrix = _matrix_with_mps(tmp_path, control=True)
    assert "MPS: daemon up, a client reached the GPU through it" in stdout and "MPS: daemon stopped" in stdout
    assert requests[0] == "get_server_list" and requests[1] == f"-d pipes={tmp_path}/mps/pipe" and requests[-1] == "quit"
    assert (matrix / "mps.txt").is_file()  # what the daemon said travels in matrix.tgz


def test_mps_missing_is_told_and_the_jobs_time_share_the_gpu(tmp_path):
    stdout, requests, matrix = _matrix_with_mps(tmp_path, control=False)
    assert "MPS: nvidia-cuda-mps-control not found: the jobs time-share the GPU" in stdout
    assert requests == [] and "daemon stopped" not in stdout


FAKE_LADDER_PYTHON = """#!/bin/bash
# Stands in for python in `gpu_session.sh ladder`: `-c` runs on the real python; the warm-up, the band check and
# the measurement parts are recorded and leave what they would write.
echo "$*" >> "$CALLS"
if [ "$1" = -c ]; then exec "$REAL_PYTHON" "$@"; fi
if [ "$1 $2" = "-m experiments.band" ]; then echo "band of $3" > "$5"; exit "${BAND_EXIT:-0}"; fi
if [ "$1" = tools/measure_usage.py ]; then
  usage=$2 module=$4; shift 4; out=""; rollouts=""; preset=""
  for a in "$@"; do case "$a" in --out=*) out=${a#--out=} ;; --rollouts_file=*) rollouts=${a#--rollouts_file=} ;; esac; done
  [ "$1" = --preset ] && preset=$2
  if [ "$module" = experiments.sft ]; then
    out=${out:-runs/$preset/sft} && mkdir -p "$out" && echo '{"params_sha256": "abc", "accuracy": []}' > "$out/sft_meta.json"
  else
    mkdir -p "$out" && echo '{}' > "$out/gradients.json"
    [ -f "$rollouts" ] || echo rollouts > "$rollouts"
  fi
  echo '{"status": "ok"}' > "$usage"
fi
"""


def _run_ladder(tmp_path, **env) -> tuple[list[str], Path]:
    """`gpu_session.sh ladder` with the stand-in python in tmp_path/work; (its python calls other than -c, $OUT)."""
    bin_dir, work, out = tmp_path / "bin", tmp_path / "work", tmp_path / "out"
    bin_dir.mkdir(exist_ok=True)
    work.mkdir(exist_ok=True)
    for name in ("python", "python3"):
        (bin_dir / name).write_text(FAKE_LADDER_PYTHON)
        (bin_dir / name).chmod(0o755)
    calls = tmp_path / "calls.txt"
    calls.unlink(missing_ok=True)
    repo = SCRIPT.parents[1]
    env = {"OUT": str(out), "PATH": f"{bin_dir}:/usr/bin:/bin", "CALLS": str(calls), "REAL_PYTHON": sys.executable,
           "PYTHONPATH": str(repo), "JAX_PLATFORMS": "cpu", "LADDER_CACHE": str(tmp_path / "cache"), **env}
    result = subprocess.run(["bash", str(SCRIPT), "ladder"], cwd=work, env=env, capture_output=True, text=True, timeout=300,
                            stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stdout + result.stderr
    return [line for line in calls.read_text().splitlines() if not line.startswith("-c")], out


def test_ladder_measures_the_parts_asked_for_and_skips_the_measured_ones(tmp_path):
    calls, out = _run_ladder(tmp_path, LADDER="ladder-w512-l32", LADDER_PARTS="1,3")
    warmups = [c for c in calls if "experiments.sft" in c]
    assert warmups == ["tools/measure_usage.py runs/ladder-w512-l32/usage_warmup.json -m experiments.sft "
                       "--preset ladder-w512-l32"]
    parts = [c for c in calls if "experiments.gradients" in c]
    assert len(parts) == 2 and all("--init=runs/ladder-w512-l32/sft" in c and
                                   "--rollouts_file=runs/ladder-w512-l32/gradients/rollouts.npz" in c for c in parts)
    assert "--recipes=nvfp4,+dq" in parts[0] and "--out=runs/ladder-w512-l32/gradients/part1" in parts[0]
    assert "--recipes=+46,full-hp" in parts[1] and "usage_part3.json" in parts[1]
    assert {p.name for p in out.iterdir()} >= {"ladder_ladder-w512-l32.tgz", "ladder_ladder-w512-l32_part1.tgz",
                                               "ladder_ladder-w512-l32_part3.tgz", "ladder_ladder-w512-l32_rollouts.tgz"}
    # the next call on the same machine: the warm-up is there, part 1 is measured, part 2 runs (a fresh checkout
    # there copies the warm-up from the machine's cache)
    calls, _ = _run_ladder(tmp_path, LADDER="ladder-w512-l32", LADDER_PARTS="1,2")
    assert not [c for c in calls if "experiments.sft" in c]
    assert [c.split("--recipes=")[1].split()[0] for c in calls if "experiments.gradients" in c] == ["nvfp4-pt"]
    assert "part 1: measured earlier" in (tmp_path / "out" / "log.txt").read_text()


def test_ladder_measures_nothing_off_the_band_or_on_another_warm_up(tmp_path):
    calls, _ = _run_ladder(tmp_path, LADDER="ladder-w512-l6", BAND_EXIT="1")
    assert any("experiments.band" in c for c in calls) and not any("experiments.gradients" in c for c in calls)
    calls, _ = _run_ladder(tmp_path, LADDER="ladder-w512-l6", WARMUP_SHA256="other")
    assert not any("experiments.gradients" in c for c in calls)
    assert "the warm-up is not the recorded one" in (tmp_path / "out" / "log.txt").read_text()


def test_ladder_second_warm_up_trains_its_steps_into_a_folder_of_its_own(tmp_path):
    calls, _ = _run_ladder(tmp_path, LADDER="ladder-w512-l6", LADDER_SFT_STEPS="800")
    sft = "runs/ladder-w512-l6/sft-steps800"
    assert any(c.endswith(f"--preset ladder-w512-l6 --steps=800 --out={sft}") for c in calls)
    assert all(f"--init={sft}" in c for c in calls if "experiments.gradients" in c)
    assert json.loads((tmp_path / "work/runs/ladder-w512-l6/ladder.json").read_text())["sft_steps"] == 800


FAKE_RECORDING_PYTHON = """#!/bin/bash
# Stands in for python: records each call, reads what it is fed, does nothing.
echo "$*" >> "$CALLS"
cat >/dev/null 2>&1 || true
"""


def _run_gradients(tmp_path, *modes: str, rollouts: bool) -> tuple[subprocess.CompletedProcess, list[str], Path]:
    """`gpu_session.sh MODES` in tmp_path/work (a warm-up already there) with a recording stand-in for python,
    the committed rollouts present or not: (the result, its python calls, the work folder)."""
    bin_dir, work, calls = tmp_path / "bin", tmp_path / "work", tmp_path / "calls.txt"
    bin_dir.mkdir()
    for name in ("python", "python3"):
        (bin_dir / name).write_text(FAKE_RECORDING_PYTHON)
        (bin_dir / name).chmod(0o755)
    (work / "runs/h200/sft").mkdir(parents=True)
    (work / "runs/h200/sft/sft_meta.json").write_text('{"params_sha256": "x"}')
    if rollouts:
        (work / "results/gradients_h200/parts").mkdir(parents=True)
        (work / "results/gradients_h200/parts/rollouts.npz").write_bytes(b"the batches")
    env = {"OUT": str(tmp_path / "out"), "PATH": f"{bin_dir}:/usr/bin:/bin", "CALLS": str(calls),
           "WARMUP_CACHE": str(tmp_path / "no_cache"), "GRAD_PART": "nvfp4", "GRAD_ARGS": "--recipes=nvfp4,+dq"}
    result = subprocess.run(["bash", str(SCRIPT), *modes], cwd=work, env=env, capture_output=True, text=True,
                            timeout=60, stdin=subprocess.DEVNULL)
    return result, (calls.read_text().splitlines() if calls.exists() else []), work


def test_gradients_without_the_fetched_rollouts_is_refused_before_any_mode_runs(tmp_path):
    result, calls, _ = _run_gradients(tmp_path, "quant", "gradients", rollouts=False)
    assert result.returncode == 1
    assert "results/gradients_h200/parts/rollouts.npz is absent" in result.stdout
    assert "python tools/data_files.py fetch" in result.stdout and "carry" in result.stdout
    assert calls == []  # neither the earlier mode nor the warm-up ran


def test_gradients_measures_on_the_carried_rollouts(tmp_path):
    result, calls, work = _run_gradients(tmp_path, "gradients", rollouts=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert (work / "runs/h200/gradients/rollouts.npz").read_bytes() == b"the batches"
    [measure] = [c for c in calls if "experiments.gradients" in c]
    assert measure == ("-m experiments.gradients --preset h200 --rollouts_file=runs/h200/gradients/rollouts.npz "
                       "--out=runs/h200/gradients/nvfp4 --recipes=nvfp4,+dq")
    assert (tmp_path / "out" / "gradients.tgz").is_file()
