"""docs/rl.md "Learning-rate pilot", step one: the largest learning rate whose bf16 arm is stable, on synthetic runs."""

import pytest

from experiments import lr_sweep as lr_sweep_cli
from fp4rl.analysis.lr_sweep import largest_stable_lr, lr_of
from fp4rl.analysis.synthetic import make_synthetic_run


def test_largest_stable_lr_skips_the_spiky_one(tmp_path, capsys):
    dirs = [make_synthetic_run(tmp_path / "lr3e-5", ["bf16"], 2, 40, seed=1),
            make_synthetic_run(tmp_path / "lr1e-4", ["bf16"], 2, 40, seed=2),
            make_synthetic_run(tmp_path / "lr3e-4", ["bf16"], 2, 40, spiky_arms=["bf16"], seed=3)]
    chosen, rows = largest_stable_lr(dirs)
    assert chosen["lr"] == pytest.approx(1e-4) and chosen["dir"] == str(dirs[1])
    assert [r["stable"] for r in rows] == [True, True, False]
    assert rows[2]["spikes"] == 2 * 2  # one 4x and one 12x spike in each of the 2 seeds
    lr_sweep_cli.main([str(d) for d in dirs])
    assert capsys.readouterr().out.strip() == str(dirs[1])


def test_no_stable_lr_and_bad_names(tmp_path):
    spiky = make_synthetic_run(tmp_path / "lr1e-3", ["bf16"], 1, 40, spiky_arms=["bf16"])
    assert largest_stable_lr([spiky])[0] is None
    with pytest.raises(SystemExit, match="no learning rate"):
        lr_sweep_cli.main([str(spiky)])
    with pytest.raises(ValueError, match="must end in lr"):
        lr_of(tmp_path / "pilot")
