"""Dropless routed experts: equal to a naive per-token loop, whatever the routing."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from fp4rl.model import init
from fp4rl.model.expert_dispatch import dispatch, padded_rows, pairs_of_rows, rows_of_tokens
from fp4rl.model.sites import Ctx
from fp4rl.recipe import PrecisionRecipe
from tests.model.common import TINY

BF16 = PrecisionRecipe.from_name("bf16")
# f32 compute (BF16 recipe sites compute in x's dtype, f32 here) against a float64 loop:
# contractions of 64 and 32 terms of O(1) values, |y| ~ 1: f32 rounding stays < 1e-5.
ATOL = 1e-5


def _silu(x):
    return x / (1.0 + np.exp(-x))


def _naive_moe(moe_params, x_TxD, weight_TxK, expert_TxK):
    """float64 loop: every token through each of its k experts, weighted, plus the shared expert."""
    p = {k: np.asarray(v, np.float64) for k, v in moe_params.items()}
    F = p["down"].shape[1]
    y = np.zeros_like(x_TxD, dtype=np.float64)
    for t in range(x_TxD.shape[0]):
        for j in range(expert_TxK.shape[1]):
            e = expert_TxK[t, j]
            gu = x_TxD[t] @ p["gate_up"][e]
            y[t] += weight_TxK[t, j] * ((_silu(gu[:F]) * gu[F:]) @ p["down"][e])
    return y


def _moe_module(graphdef, params, layer):
    return nnx.merge(graphdef, params).layers[layer].mlp


@jax.jit
def _experts(params, x_TxD, weight_TxK, expert_TxK):
    graphdef, _ = init(TINY, 0)  # structure only (the jit traces it once)
    ctx = Ctx(recipe=BF16, num_layers=TINY.num_layers, impl="reference")
    return _moe_module(graphdef, params, 0).experts(x_TxD, weight_TxK, expert_TxK, ctx)


def _layer0_params(params):
    moe = params["layers"][0]["mlp"]
    return {"gate_up": moe["gate_up"].get_value(), "down": moe["down"].get_value()}


@pytest.mark.parametrize("routing", ["random", "all_to_two_experts"])
def test_dropless_equals_naive_loop(routing):
    _, params = init(TINY, 0)
    rng = np.random.default_rng(0)
    T = 40  # one shape: one compiled program for both routings
    x = rng.normal(size=(T, TINY.d_model)).astype(np.float32)
    if routing == "all_to_two_experts":  # every token to experts 3 and 1: 40 rows in each group
        expert = np.tile(np.array([[3, 1]], np.int32), (T, 1))
    else:
        expert = np.stack([rng.choice(TINY.num_experts, 2, replace=False) for _ in range(T)]).astype(np.int32)
    weight = rng.uniform(0.1, 1.0, (T, 2)).astype(np.float32)
    y = _experts(params, x, weight, expert)
    expected = _naive_moe(_layer0_params(params), x.astype(np.float64), weight, expert)
    np.testing.assert_allclose(np.asarray(y), expected, rtol=0, atol=ATOL)


def test_dispatch_layout():
    expert_TxK = jnp.array([[2, 0], [2, 1], [0, 2]], jnp.int32)
    row_of_pair, token_of_row, pair_of_row, sizes = jax.jit(dispatch, static_argnums=(1, 2))(expert_TxK, 4, 32)
    R = padded_rows(3, 2, 4, 32)
    assert R == 160 and token_of_row.shape == (R,)  # 6 pairs + 4 * 31 padding = 130, rounded up to 32
    np.testing.assert_array_equal(sizes, [32, 32, 32, 0])
    # Stable sort: expert 0 gets pairs (t0, t2), expert 1 (t1), expert 2 (t0, t1, t2), each at
    # its group's start in token order; padding rows point at the zero row T.
    np.testing.assert_array_equal(row_of_pair, [64, 0, 65, 32, 1, 66])
    expected = np.full(R, 3)
    expected[[0, 1, 32, 64, 65, 66]] = [0, 2, 1, 0, 1, 2]
    np.testing.assert_array_equal(token_of_row, expected)
    expected_pairs = np.full(R, 6)
    expected_pairs[[0, 1, 32, 64, 65, 66]] = [1, 4, 3, 0, 2, 5]
    np.testing.assert_array_equal(pair_of_row, expected_pairs)


@pytest.mark.parametrize("T,k,E,align", [(37, 4, 8, 8), (64, 2, 32, 16), (5, 1, 3, 4), (16, 3, 4, 1)])
def test_dispatch_maps_are_mutual_inverses(T, k, E, align):
    """Random routings (some experts empty): every pair has its own row inside its expert's group,
    rows map back to their pairs, and padding rows to the sentinels."""
    rng = np.random.default_rng(T * k)
    expert_TxK = np.stack([rng.choice(E, k, replace=False) for _ in range(T)]).astype(np.int32)
    d = jax.jit(dispatch, static_argnums=(1, 2))(jnp.asarray(expert_TxK), E, align)
    row_of_pair, token_of_row, pair_of_row, sizes = (np.asarray(a) for a in d)
    P, R = T * k, padded_rows(T, k, E, align)
    assert len(set(row_of_pair.tolist())) == P
    np.testing.assert_array_equal(pair_of_row[row_of_pair], np.arange(P))
    np.testing.assert_array_equal(token_of_row[row_of_pair], np.arange(P) // k)
    padding = np.setdiff1d(np.arange(R), row_of_pair)
    assert (pair_of_row[padding] == P).all() and (token_of_row[padding] == T).all()
    ends = np.cumsum(sizes)
    group_of_row = np.searchsorted(ends, row_of_pair, side="right")
    np.testing.assert_array_equal(group_of_row, expert_TxK.reshape(-1))
    np.testing.assert_array_equal(sizes, -(-np.bincount(expert_TxK.reshape(-1), minlength=E) // align) * align)


def test_row_gathers_have_autodiffs_gradient_and_no_scatter():
    """rows_of_tokens / pairs_of_rows: the values and gradients of plain indexing (f32: the k-term
    sums agree to rounding), and neither the forward nor the backward program holds a scatter."""
    T, k, E, D = 24, 3, 6, 8
    rng = np.random.default_rng(0)
    expert_TxK = jnp.asarray(np.stack([rng.choice(E, k, replace=False) for _ in range(T)]).astype(np.int32))
    d = dispatch(expert_TxK, E, 4)
    x = jnp.asarray(rng.normal(size=(T, D)).astype(np.float32))
    w = jnp.asarray(rng.normal(size=(d.token_of_row.shape[0], D)).astype(np.float32))

    def ours(x):
        return jnp.sum(jnp.sin(pairs_of_rows(rows_of_tokens(x, d) * w, d)))

    def plain(x):
        x_R = jnp.concatenate([x, jnp.zeros((1, D), x.dtype)])[d.token_of_row]
        return jnp.sum(jnp.sin((x_R * w)[d.row_of_pair]))

    np.testing.assert_allclose(ours(x), plain(x), rtol=1e-6)
    np.testing.assert_allclose(jax.grad(ours)(x), jax.grad(plain)(x), rtol=1e-5, atol=1e-6)
    hlo = jax.jit(jax.grad(ours)).lower(x).as_text()
    assert "scatter" not in hlo
    assert "scatter" in jax.jit(jax.grad(plain)).lower(x).as_text()  # the check can fail


def test_moe_block_equals_naive_routing_and_experts():
    # The whole block: f32 router, softmax, top-k (renormalised), experts, shared expert.
    graphdef, params = init(TINY, 0)
    x = np.random.default_rng(1).normal(size=(2, 8, TINY.d_model)).astype(np.float32)

    @jax.jit
    def block(params, x):
        ctx = Ctx(recipe=BF16, num_layers=TINY.num_layers, impl="reference")
        return _moe_module(graphdef, params, 0)(x, jnp.ones(x.shape[:2], bool), ctx)

    y, expert_BxLxK, aux_loss, load_E = block(params, x)
    moe = params["layers"][0]["mlp"]
    x64 = x.reshape(-1, TINY.d_model).astype(np.float64)
    probs = np.exp(x64 @ np.asarray(moe["router"].get_value(), np.float64))
    probs /= probs.sum(-1, keepdims=True)
    top = np.argsort(-probs, axis=-1, kind="stable")[:, :2]
    np.testing.assert_array_equal(np.asarray(expert_BxLxK).reshape(-1, 2), top)
    w = np.take_along_axis(probs, top, -1)
    w /= w.sum(-1, keepdims=True)  # tiny: norm_topk_prob=True
    expected = _naive_moe(_layer0_params(params), x64, w, top)
    sh = {k: np.asarray(v.get_value(), np.float64) for k, v in moe["shared"].items()}
    gu = x64 @ sh["gate_up"]
    F = sh["down"].shape[0]
    expected += (_silu(gu[:, :F]) * gu[:, F:]) @ sh["down"]
    np.testing.assert_allclose(np.asarray(y).reshape(-1, TINY.d_model), expected, rtol=0, atol=ATOL)
    # Switch loss: E * sum_e f_e p_e with f_e the share of the T*k assignments.
    f = np.bincount(top.reshape(-1), minlength=4) / top.size
    np.testing.assert_allclose(np.asarray(load_E), f, rtol=0, atol=1e-7)
    np.testing.assert_allclose(float(aux_loss), 4 * np.sum(f * probs.mean(0)), rtol=1e-5)


def test_dropless_gradient_matches_naive():
    # qdot's custom_vjp runs per expert group; its bf16-mode backward must equal the autodiff
    # of the naive loop (in f32 jnp here) for the weights and the input.
    _, params = init(TINY, 0)
    rng = np.random.default_rng(2)
    T = 24
    x = rng.normal(size=(T, TINY.d_model)).astype(np.float32)
    expert = np.stack([rng.choice(4, 2, replace=False) for _ in range(T)]).astype(np.int32)
    weight = rng.uniform(0.1, 1.0, (T, 2)).astype(np.float32)
    cot = rng.normal(size=(T, TINY.d_model)).astype(np.float32)
    p0 = _layer0_params(params)

    def dropless(gate_up, down, x):
        p = jax.tree.map(lambda a: a, params)
        p["layers"][0]["mlp"]["gate_up"].set_value(gate_up)
        p["layers"][0]["mlp"]["down"].set_value(down)
        return jnp.sum(_experts(p, x, weight, expert) * cot)

    def naive(gate_up, down, x):
        gu = jnp.einsum("td,tkdf->tkf", x, gate_up[expert])
        F = down.shape[1]
        h = jax.nn.silu(gu[..., :F]) * gu[..., F:]
        y = jnp.einsum("tk,tkf,tkfd->td", weight, h, down[expert])
        return jnp.sum(y * cot)

    args = (p0["gate_up"], p0["down"], jnp.asarray(x))
    got = jax.grad(dropless, argnums=(0, 1, 2))(*args)
    want = jax.jit(jax.grad(naive, argnums=(0, 1, 2)))(*args)
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=0, atol=1e-4)
        assert np.abs(np.asarray(g)).max() > 0
