"""fp4rl.analysis.dose_response on a synthetic matrix with a known answer."""

import pytest

from experiments import dose_response as dose_response_cli
from fp4rl.analysis import dose_response
from fp4rl.analysis.synthetic import make_synthetic_run

ARMS = ("bf16", "nvfp4", "+dq", "nvfp4@4", "+dq@4", "nvfp4@16", "+dq@16")


def test_dose_of_reads_the_arm_names():
    assert dose_response.dose_of("nvfp4") == ("nvfp4", 1.0) and dose_response.dose_of("+dq@16") == ("+dq", 16.0)
    assert dose_response.dose_of("full") is None and dose_response.dose_of("nvfp4@x") is None
    assert dose_response.dose_of("full@4") is None and dose_response.dose_of("nvfp4@-1") is None


def test_the_first_failing_dose_of_each_backward(tmp_path, capsys):
    # the BF16-backward arm fails from a = 16 on (spikes and a lagging reward); the dequantized one never
    run_dir = make_synthetic_run(tmp_path, ARMS, seeds=4, steps=160, spiky_arms=("nvfp4@16",))
    dose_response_cli.main([str(run_dir)])
    out = capsys.readouterr().out
    assert "- bf16 backward (`nvfp4@A`): first fails at a = 16." in out
    assert "- dequantized backward (`+dq@A`): first fails at none of a = 1, 4, 16." in out
    rows = [line for line in out.splitlines() if line.startswith("| `")]
    assert [r.split("|")[1].strip() for r in rows] == ["`nvfp4`", "`nvfp4@4`", "`nvfp4@16`", "`+dq`", "`+dq@4`",
                                                        "`+dq@16`"]
    assert "FAIL (spike, reward)" in rows[2] and "PASS" in rows[0]
    assert (run_dir / "dose_response.png").read_bytes()[:4] == b"\x89PNG"


def test_a_run_without_dose_arms_is_refused(tmp_path, capsys):
    run_dir = make_synthetic_run(tmp_path, ("bf16", "full"), seeds=2, steps=40)
    with pytest.raises(SystemExit):
        dose_response_cli.main([str(run_dir)])
    assert "holds no dose-response arm" in capsys.readouterr().err
