"""fp4rl.numerics_study, fp4rl.config_cli, `python -m experiments.numerics` and its notebook."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fp4rl import config_cli
from fp4rl import numerics_study as ns
from fp4rl.formats import nvfp4
from fp4rl.formats.nvfp4 import NVFP4Config

REPO = Path(__file__).resolve().parents[1]
NVFP4, MSE256 = ns.FORMATS_BY_NAME["NVFP4"], ns.FORMATS_BY_NAME["NVFP4+4/6 MSE E=256"]
MXFP4, MXFP8 = ns.FORMATS_BY_NAME["MXFP4"], ns.FORMATS_BY_NAME["MXFP8"]


@pytest.fixture(scope="module")
def tiny():
    # 64x256: 1024 1x16 blocks per tensor, enough for the orderings below to hold by wide
    # margins (at 1024x4096: MXFP8 0.027 < NVFP4 0.095 < MXFP4 0.115 on normal data).
    return ns.run_study(
        rows=64, cols=256, seed=0, distributions=("normal", "weight"), formats=(NVFP4, MSE256, MXFP4, MXFP8)
    )


# ------------------------------------------------------------------------------ the study


def test_error_ordering_on_normal_data(tiny):
    err = {f: tiny.get("normal", "tensor", f.name).rel_error for f in (MXFP8, NVFP4, MXFP4)}
    assert err[MXFP8] < err[NVFP4] < err[MXFP4], err
    # E2M1 with a fine block scale: ~10% error on Gaussian data; E4M3 elements ~3%.
    assert 0.05 < err[NVFP4] < 0.15 and 0.01 < err[MXFP8] < 0.05, err


def test_four_over_six_mse_not_worse_than_nvfp4_per_token(tiny):
    plain = tiny.get("normal", "token", NVFP4.name).rel_error
    four_six = tiny.get("normal", "token", MSE256.name)
    assert four_six.rel_error <= plain, (four_six.rel_error, plain)


def test_four_over_six_statistics(tiny):
    m = tiny.get("normal", "tensor", MSE256.name)
    assert 0 < m.map4_fraction < 1
    assert m.blocks == 64 * 256 // 16
    # docs/numerics.md §3: fast and exact choices agree on all but rare near-ties.
    assert m.fast_exact_disagreements == round((1 - m.fast_exact_agreement) * m.blocks)
    assert m.fast_exact_agreement >= 0.99
    # 2D weights: one decision per 16x16 tile.
    assert tiny.get("weight", "tensor", MSE256.name).blocks == (64 // 16) * (256 // 16)
    # Formats without 4/6 carry no 4/6 statistics.
    assert tiny.get("normal", "tensor", NVFP4.name).map4_fraction is None


def test_not_applicable_cells_are_marked(tiny):
    for f in (MXFP4, MXFP8):
        m = tiny.get("normal", "token", f.name)
        assert m.rel_error is None and "per-token" in m.na_reason
    for f in (NVFP4, MSE256):
        m = tiny.get("weight", "token", f.name)
        assert m.rel_error is None and "per-tensor" in m.na_reason
    assert tiny.get("weight", "tensor", NVFP4.name).rel_error is not None


def test_measure_matches_the_library_directly():
    x = ns.sample("llm_activations", 32, 128, seed=3)
    cfg = MSE256.nvfp4_config("token", block_2d=False)
    expected = float(nvfp4.relative_error(x, jax.jit(nvfp4.quantize, static_argnums=1)(x, cfg)))
    assert ns.measure(x, "llm_activations", "token", MSE256).rel_error == pytest.approx(expected, rel=1e-6)


def test_report_tables(tiny):
    md = ns.markdown_report(tiny)
    assert "| normal | per-token |" in md and "| weight | per-tensor |" in md
    assert md.count("n/a") >= 4
    assert f"{tiny.get('normal', 'tensor', NVFP4.name).rel_error:.4f}" in md
    json.dumps(tiny.to_json())  # serialisable


def test_samples_are_reproducible_and_shaped():
    a, b = ns.sample("student_t", 32, 1024, seed=7), ns.sample("student_t", 32, 1024, seed=7)
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert not np.array_equal(np.asarray(a), np.asarray(ns.sample("student_t", 32, 1024, seed=8)))
    assert bool(jnp.all(jnp.isfinite(a)))
    act = np.asarray(ns.sample("llm_activations", 64, 1024, seed=0))
    col_scale = np.abs(act).max(axis=0)
    # a bulk column's max over 64 rows is ~2.5 sigma (all < 5 sigma); an outlier's >= 20x that
    outliers = col_scale > 5 * np.median(col_scale)
    assert outliers.sum() == 1024 // ns.OUTLIER_EVERY
    w = np.asarray(ns.sample("weight", 64, 1024, seed=0))
    assert abs(w.std() - ns.WEIGHT_STD) < 0.001


def test_bad_shapes_rejected_before_tracing():
    with pytest.raises(ValueError, match="rows=20 must be a positive multiple of 16"):
        ns.check_shape(20, 256)
    with pytest.raises(ValueError, match="cols=48 must be a positive multiple of 32"):
        ns.check_shape(64, 48)


@pytest.mark.parametrize(
    "config",
    [
        NVFP4Config(four_over_six=m, scale=s, fast_error=fast)
        for m in ("mae", "mse")
        for s in ("tensor", "token")
        for fast in (False, True)
    ]
    + [
        NVFP4Config(four_over_six="mae", e4m3_max=448),
        NVFP4Config(four_over_six="mse", block_2d=True),
        NVFP4Config(four_over_six="mae", block_2d=True, fast_error=True),
    ],
    ids=str,
)
def test_block_errors_decide_like_quantize(config):
    """err_4 < err_6 from four_over_six_block_errors must be quantize's map4, bit for bit."""
    # Values in {+-1, +-0.375, +-0.125} are exact on the map-to-4 grid (4 * {1, 3/8, 1/8} =
    # {4, 1.5, 0.5}) and not on map-to-6's, so these tiles choose map-4 even as 16x16 tiles,
    # where Gaussian tiles almost never do.
    friendly = np.random.default_rng(0).choice([-1, -0.375, -0.125, 0.125, 0.375, 1], (32, 256))
    x = jnp.concatenate(
        [
            ns.sample("normal", 32, 256, 1),
            ns.sample("student_t", 32, 256, 2),
            ns.sample("llm_activations", 32, 256, 3),
            jnp.asarray(friendly, jnp.float32),
        ]
    )
    err4, err6 = ns.four_over_six_block_errors(x, config)
    map4 = np.asarray(jax.jit(nvfp4.quantize, static_argnums=1)(x, config).map4)
    if config.block_2d:
        map4 = map4[::16]  # each tile's decision is repeated on its 16 rows
    choice = np.asarray(err4 < err6)
    assert choice.shape == map4.shape
    np.testing.assert_array_equal(choice, map4)
    assert 0 < choice.mean() < 1  # both candidates occur, so the comparison has teeth


# ------------------------------------------------------------------------------ config_cli


@dataclasses.dataclass(frozen=True)
class Optim:
    lr: float = 1e-3
    warmup: int = 10
    kind: Literal["adam", "sgd"] = "adam"


@dataclasses.dataclass(frozen=True)
class Toy:
    name: str = "toy"
    steps: int = 100
    verbose: bool = False
    clip: float | None = None
    tags: tuple[str, ...] = ("a",)
    sizes: tuple[int, ...] = (1, 2)
    optim: Optim = Optim()

    def __post_init__(self):
        if self.steps < 0:
            raise ValueError(f"{self.steps=} must be >= 0")


PRESETS = {"short": Toy(steps=5, optim=Optim(lr=0.5))}


def test_cli_valid_overrides_nested_and_typed():
    cfg = config_cli.parse(Toy, ["--steps=7", "--optim.lr=3e-6", "--optim.kind", "sgd", "--name=x"])
    assert cfg == Toy(name="x", steps=7, optim=Optim(lr=3e-6, kind="sgd"))
    assert isinstance(cfg.steps, int) and isinstance(cfg.optim.lr, float)


def test_cli_type_coercion():
    cfg = config_cli.parse(Toy, ["--verbose", "--clip=0.5", "--tags=x, y", "--sizes=3,4,5", "--optim.warmup=0"])
    assert cfg.verbose is True and cfg.clip == 0.5 and cfg.tags == ("x", "y") and cfg.sizes == (3, 4, 5)
    assert config_cli.parse(Toy, ["--verbose=false", "--clip=none", "--tags="]) == Toy(tags=())
    with pytest.raises(ValueError, match="--steps='many' is not a valid int"):
        config_cli.parse(Toy, ["--steps=many"])
    with pytest.raises(ValueError, match="--optim.kind='rmsprop'; valid options: adam, sgd"):
        config_cli.parse(Toy, ["--optim.kind=rmsprop"])
    with pytest.raises(ValueError, match="is not a bool"):
        config_cli.parse(Toy, ["--verbose=maybe"])
    with pytest.raises(ValueError, match="--steps needs a value"):
        config_cli.parse(Toy, ["--steps"])


def test_cli_unknown_key_names_valid_fields():
    with pytest.raises(ValueError, match="Toy has no field 'stepz'; valid fields: name, steps, verbose, clip, tags, sizes, optim"):
        config_cli.parse(Toy, ["--stepz=3"])
    with pytest.raises(ValueError, match="Optim has no field 'lrr'; valid fields: lr, warmup, kind"):
        config_cli.parse(Toy, ["--optim.lrr=3"])
    with pytest.raises(ValueError, match="--optim is a sub-config .*valid fields: lr, warmup, kind"):
        config_cli.parse(Toy, ["--optim=3"])
    with pytest.raises(ValueError, match="--steps is a .* field, not a sub-config"):
        config_cli.parse(Toy, ["--steps.x=3"])


def test_cli_presets_and_validation():
    assert config_cli.parse(Toy, ["--preset", "short"], PRESETS) == PRESETS["short"]
    # overrides apply on top of the preset wherever --preset appears
    assert config_cli.parse(Toy, ["--optim.warmup=2", "--preset=short"], PRESETS) == Toy(
        steps=5, optim=Optim(lr=0.5, warmup=2)
    )
    with pytest.raises(ValueError, match="unknown preset 'long'; valid presets: short"):
        config_cli.parse(Toy, ["--preset=long"], PRESETS)
    with pytest.raises(ValueError, match="must be >= 0"):  # __post_init__ sees the final value
        config_cli.parse(Toy, ["--steps=-1"])
    with pytest.raises(ValueError, match="unexpected argument 'oops'"):
        config_cli.parse(Toy, ["oops"])


def test_cli_exits_with_message(capsys):
    with pytest.raises(SystemExit) as e:
        config_cli.cli(Toy, PRESETS, ["--nope=1"])
    assert e.value.code == 2 and "valid fields" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        config_cli.cli(Toy, PRESETS, ["--help"])
    out = capsys.readouterr().out
    assert e.value.code == 0 and "--optim.lr=0.001" in out and "short" in out



@dataclasses.dataclass(frozen=True)
class Documented:
    """steps: optimizer updates; lr, warmup: the schedule (e.g. 3e-4 with 10 warm-up steps).
    out: where the run goes."""

    steps: int = 100
    lr: float = 3e-4
    warmup: int = 10  # linear warm-up steps
    seed: int = 0
    out: str = "runs/x"


def test_cli_help_shows_the_applied_preset_and_descriptions(capsys):
    assert config_cli.field_descriptions(Documented) == {
        "steps": "optimizer updates", "lr": "the schedule (e.g. 3e-4 with 10 warm-up steps)",
        "warmup": "linear warm-up steps", "out": "where the run goes"}
    with pytest.raises(SystemExit) as e:
        config_cli.cli(Documented, {"short": Documented(steps=5)}, ["--preset", "short", "--lr=0.5", "--help"])
    out = capsys.readouterr().out
    assert e.value.code == 0 and "preset 'short' applied" in out
    lines = {line.split()[0]: line.split(None, 1)[1:] for line in out.splitlines() if line.startswith("  --")}
    assert lines["--steps=5"] == ["optimizer updates"] and lines["--lr=0.5"] and lines["--seed=0"] == []
    assert lines["--warmup=10"] == ["linear warm-up steps"]
    with pytest.raises(SystemExit) as e:
        config_cli.cli(Documented, {}, ["--help", "--stepz=1"])  # a help with a bad override is an error
    assert e.value.code == 2

def test_numerics_config_overrides_and_presets():
    from fp4rl.configs import NUMERICS_PRESETS
    from fp4rl.numerics_study import NumericsConfig

    cfg = config_cli.parse(NumericsConfig, ["--rows=512", "--distributions=normal,weight"], NUMERICS_PRESETS)
    assert (cfg.rows, cfg.cols, cfg.distributions) == (512, 4096, ("normal", "weight"))
    assert config_cli.parse(NumericsConfig, ["--preset=smoke"], NUMERICS_PRESETS).rows == 64
    with pytest.raises(ValueError, match="rows=20 must be a positive multiple of 16"):
        config_cli.parse(NumericsConfig, ["--rows=20"])
    with pytest.raises(ValueError, match="valid options: \\('normal'"):
        config_cli.parse(NumericsConfig, ["--distributions=normal,cauchy"])


# ------------------------------------------------------------------------------ end to end


def _env():
    return {**os.environ, "JAX_PLATFORMS": "cpu"}


@pytest.mark.slow
def test_experiment_cli_writes_report(tmp_path):
    out = tmp_path / "numerics"
    proc = subprocess.run(
        [sys.executable, "-m", "experiments.numerics", "--rows=64", "--cols=256", f"--out={out}"],
        cwd=REPO, env=_env(), capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "| normal | per-tensor |" in proc.stdout
    md, png, js = (out / f"numerics.{ext}" for ext in ("md", "png", "json"))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20_000
    record = json.loads(js.read_text())
    assert record["config"]["rows"] == 64 and record["config"]["out"] == str(out)
    cells = record["measurements"]
    assert len(cells) == len(ns.DISTRIBUTIONS) * len(ns.SCALES) * len(ns.FORMATS)
    assert all(c["rel_error"] is not None or c["na_reason"] for c in cells)
    assert "MXFP8" in md.read_text()


@pytest.mark.slow
def test_notebook_executes(monkeypatch):
    nbformat = pytest.importorskip("nbformat", reason="notebook test needs nbformat (dev extra)")
    nbclient = pytest.importorskip("nbclient", reason="notebook test needs nbclient (dev extra)")
    pytest.importorskip("ipykernel", reason="notebook test needs ipykernel (dev extra)")
    nb = nbformat.read(REPO / "notebooks" / "numerics.ipynb", as_version=4)
    # kernel "python3" launches `python`, which jupyter_client maps to sys.executable (the
    # venv running the tests); the kernel inherits os.environ, so pin the CPU backend there.
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    client = nbclient.NotebookClient(
        nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(REPO / "notebooks")}}
    )
    client.execute()
    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    assert any("image/png" in o.get("data", {}) for o in outputs)
