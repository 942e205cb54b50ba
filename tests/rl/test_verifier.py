"""Verifier rules (see fp4rl/rl/verifier.py docstring) and DAPO overlong shaping."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fp4rl.rl.verifier import extract_boxed, overlong_penalty, parse_integer, reward, shaped_reward


@pytest.mark.parametrize("text, boxed", [
    ("no box here, Answer: 42", None),
    ("\\boxed{42}", "42"),
    ("b=1+2=3\nAnswer: \\boxed{3}", "3"),
    ("\\boxed{1} then \\boxed{2}", "2"),  # two boxes: the last wins
    ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),  # nested braces are matched
    ("\\boxed{ 42 }", " 42 "),
    ("\\boxed{}", ""),
    ("\\boxed{1} then \\boxed{2", None),  # the last box is unclosed (truncated): malformed
    ("\\boxed{{3}", None),
    ("\\boxed 3", None),  # no braces
    ("\\boxed{3}}", "3"),  # a stray closing brace after the box does not matter
])
def test_extract_boxed(text, boxed):
    assert extract_boxed(text) == boxed


@pytest.mark.parametrize("text, answer, expected", [
    ("Answer: \\boxed{42}", 42, 1.0),
    ("Answer: \\boxed{41}", 42, -1.0),
    ("Answer: 42", 42, -1.0),  # no box
    ("", 42, -1.0),
    ("\\boxed{42} wait, \\boxed{43}", 43, 1.0),  # last box wins
    ("\\boxed{42} wait, \\boxed{43}", 42, -1.0),
    ("\\boxed{ 42 }", 42, 1.0),  # surrounding spaces are fine
    ("\\boxed{\n42\n}", 42, 1.0),
    ("\\boxed{-7}", -7, 1.0),
    ("\\boxed{-7}", 7, -1.0),
    ("\\boxed{- 7}", -7, -1.0),  # space between sign and digits: not a literal
    ("\\boxed{+5}", 5, 1.0),  # decided: an explicit plus sign is an integer literal
    ("\\boxed{007}", 7, 1.0),  # leading zeros: int() literal, accepted
    ("\\boxed{-0}", 0, 1.0),
    ("\\boxed{4.0}", 4, -1.0),  # non-integer literals are -1 even when equal in value
    ("\\boxed{4/1}", 4, -1.0),
    ("\\boxed{1,000}", 1000, -1.0),
    ("\\boxed{1 000}", 1000, -1.0),
    ("\\boxed{1_000}", 1000, -1.0),  # int() would accept this; the rule does not
    ("\\boxed{$4$}", 4, -1.0),
    ("\\boxed{\\frac{8}{2}}", 4, -1.0),
    ("\\boxed{}", 0, -1.0),
    ("\\boxed{\u0664}", 4, -1.0),  # ARABIC-INDIC DIGIT FOUR: ASCII digits only
    ("\\boxed{42", 42, -1.0),  # unclosed
    ("\\boxed{\\boxed{42}}", 42, -1.0),  # outer box content is "\boxed{42}", not an integer
])
def test_reward(text, answer, expected):
    assert reward(text, answer) == expected


def test_parse_integer_types():
    assert parse_integer(34) == 34 and parse_integer(np.int64(-2)) == -2
    assert parse_integer(" 34 ") == 34
    assert parse_integer(True) is None and parse_integer(34.0) is None
    assert parse_integer(None) is None
    assert parse_integer("12345678901234567890123") == 12345678901234567890123


# L = 20, C = 5: no penalty up to 15 tokens, linear to -1 at 20, -1 beyond.
@pytest.mark.parametrize("length, expected", [
    (0, 0.0), (14, 0.0), (15, 0.0), (16, -0.2), (18, -0.6), (19, -0.8),
    (20, -1.0),  # len == L: exactly -1 (continuous with the linear part)
    (21, -1.0), (1000, -1.0),
])
def test_overlong_penalty_boundaries(length, expected):
    assert overlong_penalty(length, 20, 5) == pytest.approx(expected, abs=1e-12)


def test_overlong_penalty_array_matches_scalar_and_jits():
    lengths = np.arange(0, 30)
    expected = np.array([overlong_penalty(int(n), 20, 5) for n in lengths])
    got = jax.jit(lambda n: overlong_penalty(n, 20, 5))(jnp.asarray(lengths))
    np.testing.assert_allclose(np.asarray(got), expected, rtol=0, atol=1e-6)  # float32


@pytest.mark.parametrize("buffer, max_len", [(0, 20), (21, 20)])
def test_overlong_penalty_validates(buffer, max_len):
    with pytest.raises(ValueError, match="buffer"):
        overlong_penalty(3, max_len, buffer)


def test_shaped_reward():
    assert shaped_reward("\\boxed{3}", 3, length=16, max_len=20, buffer=5) == pytest.approx(0.8)
    assert shaped_reward("\\boxed{3}", 4, length=20, max_len=20, buffer=5) == -2.0
