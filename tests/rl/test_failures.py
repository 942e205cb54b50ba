"""`fp4rl.rl.failures`: a wrong response is a miscopied box or a wrong chain, told apart by the
scratchpad's last computed value."""

from __future__ import annotations

import pytest

from fp4rl.rl import failures, verifier
from fp4rl.rl.task import TaskConfig, make_problem, noisy_solution


@pytest.mark.parametrize("text, answer, kind", [
    ("b=8-6=2\nAnswer: \\boxed{2}", 2, "right"),
    ("b=8-6=2\nAnswer: \\boxed{5}", 2, "miscopied"),       # the chain computed 2, the box says 5
    ("b=8-6=1\nAnswer: \\boxed{1}", 2, "wrong_chain"),     # an arithmetic slip, faithfully copied
    ("b=8-6=1\nAnswer: \\boxed{2}", 2, "right"),           # the verifier reads the box only
    ("b=4-7=-3\nc=-3*2=-6\nAnswer: \\boxed{6}", -6, "miscopied"),  # signs, the last line's value
    ("b=4-7=-3\nc=-3*2=-5\nAnswer: \\boxed{-6}", -6, "right"),
    ("Answer: \\boxed{3}", 2, "wrong_chain"),              # no scratchpad line
    ("b=8-6=2\nAnswer: 2", 2, "miscopied"),                # no box at all, the chain was right
    ("b=8-6=", 2, "wrong_chain"),                          # cut off mid-line
])
def test_kinds(text, answer, kind):
    assert failures.classify(text, answer) == kind


def test_the_noisy_teachers_corruption_is_a_miscopy():
    """Every solution `task.noisy_solution` corrupts is a miscopied box, every one it keeps is right,
    over a band with one to four operations."""
    task = TaskConfig(min_ops=1, max_ops=4, digits=2, operators="+-*")
    kinds = []
    for i in range(200):
        problem = make_problem(i, 7, task)
        text = noisy_solution(problem, i, 7, noise=0.5)
        kinds.append(failures.classify(text, problem.answer))
        assert kinds[-1] == ("right" if text == problem.solution else "miscopied")
    assert 60 < kinds.count("miscopied") < 140


def test_fractions_cover_every_response():
    fractions = failures.fractions(["x=1\nAnswer: \\boxed{1}", "x=1\nAnswer: \\boxed{2}", "x=3\nAnswer: \\boxed{3}",
                                    "x=1\nAnswer: \\boxed{1}"], [1, 1, 1, 1])
    assert fractions == {"right": 0.5, "miscopied": 0.25, "wrong_chain": 0.25}
    assert verifier.BOX == "\\boxed{"
