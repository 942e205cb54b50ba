"""tools/seed_axis_bits.py: byte comparisons say where values differ, and the op walk names the
primitive (inside nested calls) whose batched output differs, with its source line."""

import jax
import jax.numpy as jnp
import numpy as np

from tests.tool_module import load_tool


def test_difference_compares_bytes_and_names_the_first_differing_value():
    tool = load_tool("seed_axis_bits")
    a = np.array([[1.0, 2.0], [3.0, 0.0]], np.float32)
    assert tool.difference(a.copy(), a) is None
    b = a.copy()
    b[1, 0] = np.nextafter(np.float32(3.0), np.float32(4.0))
    b[1, 1] = -0.0  # equal as numbers, other bytes
    message = tool.difference(b, a)
    assert message.startswith("2 of 4 differ (max |diff| 2.38e-07, first at (1, 0)"), message
    assert tool.difference(np.array([1, 5], np.int32), np.array([1, 4], np.int32)) == "1 of 2 differ (first at (1,): 5 vs 4)"
    assert tool.difference(a[0], a) == "shape (2,) != (2, 2)"


def _f(x):
    inner = jax.jit(lambda y: (y * 3) // 2)
    return inner(x) + jnp.sum(x)


def test_op_walk_finds_nothing_in_exact_integer_ops():
    tool = load_tool("seed_axis_bits")
    x = jnp.arange(12, dtype=jnp.int32).reshape(3, 4)
    closed = jax.make_jaxpr(_f)(x)
    walk = tool.OpWalk([1, 2, 4], limit=5)
    (out,) = walk.run(closed.jaxpr, closed.consts, [x])
    assert walk.found == []
    np.testing.assert_array_equal(out, _f(x))  # the walk computes the function's value


def test_op_walk_names_the_first_primitive_whose_batched_output_differs(monkeypatch):
    """A `mul` that rounds differently at S=2 (stood in for by a changed output) is named, with its
    source line, though it sits inside a nested jit; the walk stops at `limit`."""
    tool = load_tool("seed_axis_bits")
    run_alone = tool._run_alone

    def mul_differs_at_two(eqn, values, S):
        outs = run_alone(eqn, values, S)
        return [o + 1 for o in outs] if eqn.primitive.name == "mul" and S == 2 else outs

    monkeypatch.setattr(tool, "_run_alone", mul_differs_at_two)
    x = jnp.arange(12, dtype=jnp.int32).reshape(3, 4)
    closed = jax.make_jaxpr(_f)(x)
    walk = tool.OpWalk([1, 2, 4], limit=1)
    walk.run(closed.jaxpr, closed.consts, [x])
    (found,) = walk.found
    assert found.startswith("mul (output 0, int32[3, 4]) at ") and "test_seed_axis_bits.py" in found, found
    assert "S=2, seeds [0, 1]; seed 0: 12 of 12 differ (first at (0, 0): 1 vs 0)" in found, found
