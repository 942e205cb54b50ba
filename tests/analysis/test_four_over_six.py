"""fp4rl.analysis.four_over_six (the numerics notebook's 4/6 section) on small tensors."""

import numpy as np
import pytest
from matplotlib.figure import Figure

from fp4rl import numerics_study as ns
from fp4rl.analysis import four_over_six as fos
from fp4rl.formats import NVFP4Config

ROWS, COLS, SEED = 64, 256, 0
MAE, MSE = ns.FORMATS_BY_NAME["NVFP4+4/6 MAE E=256"], ns.FORMATS_BY_NAME["NVFP4+4/6 MSE E=256"]
NVFP4 = ns.FORMATS_BY_NAME["NVFP4"]


def _result():
    """A hand-built StudyResult: the 4/6 formats have map-4 fractions on `normal` only."""
    ms = []
    for d in ("normal", "weight"):
        for s in ns.SCALES:
            for i, f in enumerate((NVFP4, MAE, MSE)):
                has = f.four_over_six is not None and d == "normal"
                ms.append(ns.Measurement(d, s, f.name, 0.1, map4_fraction=0.1 * i + (s == "token") if has else None,
                                         fast_exact_agreement=0.995 if has else None,
                                         fast_exact_disagreements=5 if has else None, blocks=1000 if has else None))
    return ns.StudyResult(ROWS, COLS, SEED, ("normal", "weight"), tuple(ms), 0.0)


def test_map4_fractions_and_agreement_lines():
    result = _result()
    labels, fractions = fos.map4_fractions(result, (NVFP4, MAE, MSE))
    assert labels == [("normal", "tensor"), ("normal", "token")]
    assert fractions == {MAE.name: [pytest.approx(0.1), pytest.approx(1.1)],
                         MSE.name: [pytest.approx(0.2), pytest.approx(1.2)]}
    assert fos.map4_fractions(result, (NVFP4,)) == ([], {})
    lines = fos.agreement_lines(result, (NVFP4, MAE, MSE))
    assert lines == [f"{f.name}: fast/exact choice agreement 99.500% (5 of 1000 blocks differ), normal per-token"
                     for f in (MAE, MSE)]
    fig = fos.map4_fraction_figure(result, (NVFP4, MAE, MSE))
    assert isinstance(fig, Figure) and len(fig.axes[0].patches) == 4  # 2 formats x 2 cells


@pytest.mark.parametrize("dist,scale,metric", [("normal", "token", "mae"), ("weight", "tensor", "mse")])
def test_block_error_ratios_match_the_library_choice(dist, scale, metric):
    x = ns.sample(dist, ROWS, COLS, SEED)
    cfg = NVFP4Config(four_over_six=metric, scale=scale, block_2d=ns.is_weight(dist))
    ratio, map4 = fos.block_error_ratios(x, cfg)
    blocks = ROWS * COLS // (256 if cfg.block_2d else 16)
    assert ratio.size == blocks  # random data: no zero-error block
    assert (ratio > 0).all() and map4 == pytest.approx(np.mean(ratio < 1))


def test_block_error_ratios_catches_a_choice_that_disagrees(monkeypatch):
    real = ns.four_over_six_block_errors
    monkeypatch.setattr(ns, "four_over_six_block_errors", lambda x, c: tuple(reversed(real(x, c))))  # err4 <-> err6
    with pytest.raises(AssertionError, match="disagrees"):
        fos.block_error_ratios(ns.sample("normal", ROWS, COLS, SEED), NVFP4Config(four_over_six="mse", scale="token"))


def test_crest_factor():
    x = np.zeros((2, 32))
    x[0, :16] = 3.0  # constant block: max = rms
    x[0, 16] = -2.0  # one-hot block: max / rms = sqrt(16)
    x[1] = np.arange(32)
    crest = fos.crest_factor(x[:1])
    assert crest == pytest.approx(np.array([[1.0, 4.0]]))
    assert fos.crest_factor(x).shape == (2, 2)


def test_map4_wins_on_low_crest_blocks():
    x = np.asarray(ns.sample("normal", ROWS, COLS, SEED))
    centres, frac = fos.map4_by_crest(x, NVFP4Config(four_over_six="mse", scale="token"), n_bins=4)
    assert centres.shape == frac.shape == (4,) and (np.diff(centres) > 0).all()
    assert frac[0] > frac[-1]  # map-to-4's grid is finer near the block max (docs/numerics.md §3)


def test_figures_render():
    ratio_fig = fos.error_ratio_figure(32, 256, SEED, cases=(("normal", "token"), ("weight", "tensor")))
    assert len(ratio_fig.axes) == 2
    assert [t.get_text().split(":")[0] for t in ratio_fig.axes[0].get_legend().get_texts()] == ["MAE", "MSE"]
    crest_fig = fos.crest_figure(32, 256, SEED)
    assert len(crest_fig.axes[0].get_lines()) == 2
