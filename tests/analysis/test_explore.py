"""fp4rl.analysis.explore and explore_plots (the ablation explorer notebook's library) on
synthetic run directories with known spikes (`fp4rl.analysis.synthetic`)."""

import json
import math

import numpy as np
import pytest
from matplotlib.figure import Figure

from fp4rl.analysis import explore, explore_plots
from fp4rl.analysis.criteria import StabilityCriteria
from fp4rl.analysis.report import write_report
from fp4rl.analysis.runs import GRAD_GROUPS, RunLoadWarning, load_run
from fp4rl.analysis.synthetic import SEVERE_FACTOR, SPIKE_FACTOR, injected_spikes, make_synthetic_run

C = StabilityCriteria()
STEPS = 80  # 60 judged steps: enough power (>= 50) for a spike verdict
SPIKE, SEVERE = injected_spikes(STEPS)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    return make_synthetic_run(tmp_path_factory.mktemp("run"), ("bf16", "full", "full-dq"), seeds=2, steps=STEPS,
                              spiky_arms=("full-dq",))


@pytest.fixture(scope="module")
def judged(run_dir):
    _, run = explore.open_run(run_dir)
    return run, *explore.judge(run, C)


def test_md_table_escapes_pipes_and_newlines():
    text = explore.md_table(("a", "b"), [("x|y", "1\n2"), (3, None)])
    assert text.splitlines() == ["| a | b |", "|---|---|", "| x\\|y | 1 2 |", "| 3 | None |"]


def test_report_sections_split_at_level_two_headings():
    text = "# title\npreamble\n## Claim\n\nyes\n### sub\nmore\n## Notes\n- n\n"
    assert explore.report_sections(text) == {"Claim": "yes\n### sub\nmore", "Notes": "- n"}
    assert explore.report_sections("no heading") == {}


def test_resolve_run_dir_prefers_cwd_then_repo(tmp_path):
    (tmp_path / "here").mkdir()
    assert explore.resolve_run_dir(tmp_path / "x") == tmp_path / "x"  # absolute: as is
    assert explore.resolve_run_dir("here", cwd=tmp_path) == tmp_path / "here"
    assert explore.resolve_run_dir("fp4rl", cwd=tmp_path).name == "fp4rl"  # the repo's package dir
    assert (explore.resolve_run_dir("fp4rl", cwd=tmp_path) / "analysis").is_dir()
    with pytest.raises(FileNotFoundError, match="experiments.ablation"):
        explore.open_run("no/such/run", cwd=tmp_path)


def test_open_run_collects_load_warnings(tmp_path):
    run_dir = make_synthetic_run(tmp_path, ("bf16",), seeds=1, steps=STEPS)
    path = run_dir / "bf16" / "seed0" / "metrics.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines()]
    path.write_text("".join(json.dumps({k: v for k, v in r.items() if k != "entropy"}) + "\n" for r in records))
    with pytest.warns(RunLoadWarning):
        load_run(run_dir)  # loading warns ...
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error", RunLoadWarning)
        _, run = explore.open_run(run_dir)  # ... open_run does not, and keeps them
    assert any("entropy" in w for w in run.warnings)
    head, rows = explore.overview_table(run)
    assert rows[0][-1] == "entropy"  # required keys never logged


def test_overview_table_counts_updates_and_evaluations(tmp_path):
    run_dir = make_synthetic_run(tmp_path, ("bf16", "nvfp4"), seeds=2, steps=STEPS, updates_per_step=3)
    for k in (0, 1):
        (run_dir / "nvfp4" / f"seed{k}" / "updates.jsonl").unlink()
    head, rows = explore.overview_table(explore.open_run(run_dir)[1])
    assert len(head) == len(rows[0]) == 8
    by_arm = {r[0]: r for r in rows}
    bf16 = by_arm["`bf16`"]
    assert bf16[2] == "0, 1" and bf16[3] == f"{STEPS}-{STEPS}" and bf16[4] == STEPS - 1
    assert bf16[5] == f"{2 * 3 * STEPS} in 2 of 2 seeds"
    assert bf16[6] == 2 * 5  # evaluations at steps 0, 20, 40, 60 and the last, per seed
    assert bf16[7] == "-"
    assert by_arm["`nvfp4`"][5] == "none (per-step means)"


def test_bullet_list():
    assert explore.bullet_list("Load warnings", []) == "**Load warnings:**\n\n- none"
    assert explore.bullet_list("T", ["a", "b"]) == "**T:**\n\n- a\n- b"


def test_ratio_to_window():
    x = np.array([1.0, 2.0, np.nan, 3.0, 10.0])
    assert explore.ratio_to_window(x, 4, window=50) == pytest.approx(10.0 / 2.0)  # median of 1, 2, 3
    assert explore.ratio_to_window(x, 4, window=1) == pytest.approx(10.0 / 3.0)  # the last finite value only
    assert explore.ratio_to_window(x, 3, window=2) == pytest.approx(3.0 / 1.5)  # NaN skipped, not counted
    assert math.isnan(explore.ratio_to_window(x, 0, window=5))  # nothing before
    assert math.isnan(explore.ratio_to_window(x, 2, window=5))  # x[i] not finite


def test_largest_groups():
    assert explore.largest_groups({"a": 2.0, "b": 1.995, "c": 1.0}, n_groups=3) == "a, b"
    assert explore.largest_groups({"a": 2.0, "b": 2.0}, n_groups=2) == "all groups alike"
    assert explore.largest_groups({"a": math.nan}, n_groups=2) == "n/a"


def test_spike_attribution_finds_the_injected_spikes(judged):
    run, summaries, verdicts, claim = judged
    head, rows = explore.spike_attribution(run, summaries, C)
    assert len(head) == len(rows[0])
    assert {r[0] for r in rows} == {"`full-dq`"}  # only the spiky arm
    assert sorted((r[1], r[2], r[3]) for r in rows) == [(0, SPIKE, "spike"), (0, SEVERE, "severe"),
                                                        (1, SPIKE, "spike"), (1, SEVERE, "severe")]
    for r in rows:
        ratio = float(r[4].rstrip("x"))
        injected = SPIKE_FACTOR if r[3] == "spike" else SEVERE_FACTOR
        assert injected * 0.7 < ratio < injected * 1.3, r  # the update's ratio: injected x noise
        assert r[5] == 0  # the spiking update
        assert r[6] == "all groups alike"  # the synthetic groups are one scaled series
        groups = dict(part.rsplit(" ", 1) for part in r[7].split(", "))
        assert list(groups) == list(GRAD_GROUPS)
        for g in groups.values():  # per step: the mean of the spiking update and an ordinary one
            assert (injected + 1) / 2 * 0.7 < float(g.rstrip("x")) < (injected + 1) / 2 * 1.3, r


def test_correlation():
    g = np.exp(np.arange(1.0, 6.0))
    assert explore.correlation(g, np.arange(5.0)) == pytest.approx((1.0, 1.0))  # reward linear in log g
    pearson, spearman = explore.correlation(g, -np.arange(5.0) ** 3)  # monotone, not linear
    assert spearman == pytest.approx(-1.0) and -1.0 < pearson < -0.9
    assert all(math.isnan(v) for v in explore.correlation(g[:2], np.arange(2.0)))
    assert all(math.isnan(v) for v in explore.correlation(g, np.ones(5)))


def test_reward_grad_points_and_table(judged, tmp_path):
    run, summaries, _, _ = judged
    points = explore.reward_grad_points(run, summaries)
    assert list(points) == list(run.arms)
    p = points["full-dq"]
    assert p.n_seeds == 2 and p.grad.size == p.reward.size == 2 * STEPS
    assert int(p.spike.sum()) == 4 and (p.grad[p.spike] > np.median(p.grad) * 2).all()
    assert not points["bf16"].spike.any()
    head, rows = explore.correlation_table(points)
    assert [r[0] for r in rows] == [f"`{a}`" for a in run.arms] and rows[0][1] == 2 * STEPS


def test_with_spike_factor_keeps_severe_above_spike():
    assert explore.with_spike_factor(C, 2.0).severe_factor == C.severe_factor
    c = explore.with_spike_factor(C, 15.0)
    assert (c.spike_factor, c.severe_factor) == (15.0, 15.0)


def test_sensitivity_table(judged):
    run = judged[0]
    head, rows = explore.sensitivity_table(run, C, (3.0, 20.0))
    assert head == ["arm"] + [f"{f}x: spikes/100 mean (count); spike; verdict" for f in (3, 20)]
    by_arm = {r[0]: r for r in rows}
    # 2 seeds x 2 spikes against none: too few seeds to decide the spike comparison (its reward fails)
    assert by_arm["`full-dq`"][1] == f"{100 * 2 / (STEPS - C.warmup_steps):.2f} (4); UNDECIDED; **FAIL**"
    assert by_arm["`full-dq`"][2] == "0.00 (0); UNDECIDED; **FAIL**"  # no spike above 20x
    assert by_arm["`bf16`"][1] == "0.00 (0); UNDECIDED; UNDECIDED"  # the reference is not judged
    assert rows[-1][0] == "**claim**" and len(rows[-1]) == 3
    assert "10x" in explore.sensitivity_note(C)


def test_spike_rate_curve_falls_with_the_factor(judged):
    run, summaries, _, _ = judged
    factors = (1.5, 3.0, 5.0, 11.0, 20.0)
    curve = explore.spike_rate_curve(run.arms["full-dq"].values(), C, factors)
    assert (np.diff(curve) <= 0).all()
    declared = np.mean([s.spikes_per_100 for s in summaries["full-dq"].seeds])
    assert curve[1] == pytest.approx(declared)  # 3x: the declared judgement
    assert curve[3] == pytest.approx(100 / (STEPS - C.warmup_steps))  # only the 12x spike left
    assert curve[4] == 0.0


def test_arm_stats(tmp_path):
    run_dir = make_synthetic_run(tmp_path, ("bf16",), seeds=2, steps=STEPS)
    path = run_dir / "bf16" / "seed1" / "metrics.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines()]
    records[5]["entropy"] = -1.0
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    seeds = explore.open_run(run_dir)[1].arms["bf16"]
    steps, med, lo, hi = explore.arm_stats(seeds.values(), "entropy", log=False)
    assert steps.size == STEPS and lo[5] == -1.0 and med[5] == pytest.approx((hi[5] - 1.0) / 2)
    steps, med, lo, hi = explore.arm_stats(seeds.values(), "entropy", log=True)
    assert lo[5] == hi[5] == med[5] > 0  # the non-positive value is a gap on a log axis
    assert explore.arm_stats(seeds.values(), "no/such_key", log=False) is None


def test_compare_with_report_on_disk(tmp_path):
    run_dir = make_synthetic_run(tmp_path, ("bf16", "full"), seeds=2, steps=STEPS, spiky_arms=("full",))
    run = explore.open_run(run_dir)[1]
    sections = explore.rendered_sections(run, *explore.judge(run, C), C)
    assert sections["Per-arm results"].startswith("| arm |")
    assert explore.compare_with_report_on_disk(run_dir, sections).startswith("no report.md")
    write_report(run_dir)
    assert explore.compare_with_report_on_disk(run_dir, sections).endswith("identical to the one above")
    write_report(run_dir, criteria=explore.with_spike_factor(C, 20.0))  # the spikes no longer count
    assert "DIFFERS" in explore.compare_with_report_on_disk(run_dir, sections)


def test_overlay_draws_each_arm_or_says_not_logged(judged):
    run = judged[0]
    fig = Figure()
    ax1, ax2 = fig.subplots(1, 2)
    assert explore_plots.overlay(ax1, run, "grad_norm/router", C)
    assert [line.get_label() for line in ax1.get_lines()] == [f"{a} (n=2)" for a in run.arms]
    assert ax1.get_yscale() == "log"
    assert not explore_plots.overlay(ax2, run, "no/such_key", C)
    assert not ax2.get_lines() and ax2.texts[0].get_text() == "no/such_key: not logged"
    explore_plots.legend_below(fig, (ax1, ax2))
    assert len(fig.legends) == 1 and len(fig.legends[0].get_texts()) == len(run.arms)


def test_learning_figure_draws_every_evaluation_from_before_rl(tmp_path):
    _, run = explore.open_run(make_synthetic_run(tmp_path, ("bf16", "full"), seeds=2, steps=45, initial_eval=True))
    fig = explore_plots.learning_figure(run)
    sampled, greedy = fig.axes[:2]
    assert [line.get_label() for line in sampled.get_lines()] == [f"{a} (n=2)" for a in run.arms]
    seed = next(iter(run.arms["bf16"].values()))
    evaluated = [0] + [int(s) + 1 for s, ok in zip(seed.steps, seed.present["eval/sampled_accuracy"]) if ok]
    for ax, key in ((sampled, "eval/sampled_accuracy"), (greedy, "eval/accuracy")):
        line = ax.get_lines()[0]  # bf16
        assert list(line.get_xdata()) == evaluated  # x: updates done, the initial evaluation at 0
        values = np.stack([r.metrics[key][r.present[key]] for r in run.arms["bf16"].values()])
        np.testing.assert_array_equal(line.get_ydata()[1:], np.median(values, 0))
        initial = [r.metrics[key.replace("eval/", "eval/initial_")][0] for r in run.arms["bf16"].values()]
        assert line.get_ydata()[0] == np.median(initial)


def test_learning_figure_says_when_nothing_was_evaluated(tmp_path):
    run_dir = make_synthetic_run(tmp_path, ("bf16",), seeds=1, steps=30, eval_n=None)
    for path in run_dir.glob("bf16/seed*/metrics.jsonl"):
        records = [{k: v for k, v in json.loads(line).items() if not k.startswith("eval/")}
                   for line in path.read_text().splitlines()]
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
    _, run = explore.open_run(run_dir)
    fig = explore_plots.learning_figure(run)
    assert not fig.axes[0].get_lines() and fig.axes[0].texts[0].get_text() == "no held-out evaluation logged"


def test_show_outside_ipython_prints_the_path(tmp_path, capsys):
    explore.show_md("**x**")
    path = tmp_path / "f.png"
    explore_plots.show(Figure(), path)
    assert path.is_file() and capsys.readouterr().out == f"**x**\n[figure written to {path}]\n"


def test_figures_render(judged, tmp_path):
    run, summaries, _, _ = judged
    figs = {
        "groups": explore_plots.grad_norm_groups_figure(run, C),
        "mismatch": explore_plots.mismatch_figure(run, C),
        "scatter": explore_plots.reward_vs_grad_norm_figure(explore.reward_grad_points(run, summaries)),
        "sensitivity": explore_plots.spike_sensitivity_figure(run, C, factors=(2.0, 3.0, 12.0)),
    }
    assert len(figs["groups"].axes) == len(GRAD_GROUPS)
    assert len(figs["mismatch"].axes) == 2
    sens = figs["sensitivity"].axes[0]
    curves = [line for line in sens.get_lines() if line.get_label().endswith("(n=2)")]
    assert len(curves) == len(run.arms) and list(curves[-1].get_xdata()) == [2.0, 3.0, 12.0]
    for name, fig in figs.items():
        path = explore_plots.save(fig, tmp_path / f"{name}.png")
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
