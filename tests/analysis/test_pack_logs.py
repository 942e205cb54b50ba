"""Packed (gzipped) seed logs: fp4rl.analysis.pack_logs and the readers that take either form."""

import numpy as np
import pytest

from experiments import pack_logs as pack_logs_cli
from fp4rl.analysis import learning, pack_logs
from fp4rl.analysis.runs import has_arm_metrics, load_run, seed_log
from fp4rl.analysis.synthetic import make_synthetic_run


def _same_runs(a, b):
    assert a.arm_names == b.arm_names
    for arm in a.arms:
        assert sorted(a.arms[arm]) == sorted(b.arms[arm])
        for seed, run in a.arms[arm].items():
            other = b.arms[arm][seed]
            assert run.steps.tolist() == other.steps.tolist()
            assert run.metrics.keys() == other.metrics.keys()
            for key, values in run.metrics.items():
                np.testing.assert_array_equal(values, other.metrics[key])
            assert run.updates is not None and other.updates is not None
            np.testing.assert_array_equal(run.updates.metrics["grad_norm/global"],
                                          other.updates.metrics["grad_norm/global"])


def test_packed_run_loads_as_the_plain_one(tmp_path):
    plain = make_synthetic_run(tmp_path / "plain", ["bf16", "full"], seeds=2, steps=40, spiky_arms=["full"], initial_eval=True)
    packed = make_synthetic_run(tmp_path / "packed", ["bf16", "full"], seeds=2, steps=40, spiky_arms=["full"], initial_eval=True)
    written = pack_logs.pack_tree(packed)
    assert len(written) == 8 and all(p.name.endswith(".jsonl.gz") for p in written)
    assert not list(packed.rglob("*.jsonl"))  # the originals are gone
    assert has_arm_metrics(packed)
    loaded = load_run(packed)
    assert loaded.arms["full"][1].path.name == "metrics.jsonl.gz"
    _same_runs(load_run(plain), loaded)
    assert learning.markdown(learning.summarize(packed / "full")) == learning.markdown(learning.summarize(plain / "full"))


def test_packing_is_deterministic_and_refuses_ambiguity(tmp_path):
    a = make_synthetic_run(tmp_path / "a", ["bf16"], seeds=1, steps=5)
    b = make_synthetic_run(tmp_path / "b", ["bf16"], seeds=1, steps=5)
    packed_a, packed_b = pack_logs.pack_tree(a), pack_logs.pack_tree(b)
    assert [p.read_bytes() for p in packed_a] == [p.read_bytes() for p in packed_b]  # no timestamp or name
    # a plain log beside its packed form: which one is the log is ambiguous
    (a / "bf16" / "seed0" / "metrics.jsonl").write_text("{}\n", encoding="utf-8")
    with pytest.raises(FileExistsError, match="ambiguous"):
        pack_logs.pack_tree(a)
    assert seed_log(a / "bf16" / "seed0", "metrics.jsonl").name == "metrics.jsonl"  # plain wins when both exist
    assert seed_log(a / "bf16" / "seed0", "absent.jsonl") is None


def test_pack_logs_command_names_a_missing_directory(tmp_path, capsys):
    with pytest.raises(SystemExit):
        pack_logs_cli.main([str(tmp_path / "nowhere")])
    assert "is not a directory" in capsys.readouterr().err
