"""On a GPU the model's default quantizer implementation ("auto") is the Triton kernel, and it
gives the same bytes as the jnp reference inside the whole training program: scanned layers,
vmapped seeds, custom_vjp backward, weight sync (`pytest -m gpu tests/model/test_gpu_impl.py`).

Bitwise equality holds because both follow docs/numerics.md exactly on the GPU (the reference
divides through `ieee.integer_divide` there) and every GEMM receives the same operands. Run it
with `XLA_FLAGS=--xla_gpu_deterministic_ops=true` (`tools/gpu_session.sh` does): otherwise GPU
scatter-adds (the embedding gradient) sum in a run-dependent order.
"""

import dataclasses
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fp4rl.model import flat_params, forward, init, sync
from fp4rl.operands import resolve_impl
from fp4rl.recipe import PrecisionRecipe
from pallas_kernels.nvfp4_quant.triton import QUANT_NAME
from tests.kernels.quant_suite import gpu_present
from tests.model.common import KEY, TINY, tokens

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not gpu_present(), reason="needs a CUDA GPU")]

CONFIG = dataclasses.replace(TINY, num_layers=3, dtype="bfloat16")  # scanned runs under every recipe


def test_auto_is_triton_on_gpu():
    assert resolve_impl("auto") == "triton"


@pytest.mark.parametrize("name", ["nvfp4-pt", "full", "+46"])  # nvfp4-pt: the quantized backward
def test_triton_training_step_equals_reference(name):
    recipe = PrecisionRecipe.from_name(name)
    graphdef, params = init(CONFIG, 0)
    seeds = jax.tree.map(lambda a, b: jnp.stack([a, b]), params, init(CONFIG, 1)[1])  # 2 seeds
    seqs = jnp.asarray(tokens(8, batch=4, length=33))

    def loss(p, impl):
        logits, aux = forward(graphdef, p, seqs[:, :-1], recipe, key=KEY, impl=impl)
        nll = -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), seqs[:, 1:, None], axis=-1))
        return nll + aux["aux_loss"], logits

    def step(impl):
        return jax.jit(jax.vmap(jax.grad(lambda p: loss(p, impl), has_aux=True)))

    start = time.perf_counter()

    def phase(what):  # printed (pytest -s): where a slow GPU compile spends its time
        print(f"[{name}] {what}: {time.perf_counter() - start:.1f}s", flush=True)

    assert QUANT_NAME in step("auto").lower(seeds).as_text(), "the Triton quantizer is not in the program"
    phase("lowered")
    # Checked from the innermost piece outwards, so a failure says where the two impls part:
    # the weight sync (quantizers on weights alone), the forward, then the gradients.
    q_tri, _ = jax.jit(lambda p: sync.sync_weights(p, CONFIG, recipe, "triton"))(params)
    q_ref, _ = jax.jit(lambda p: sync.sync_weights(p, CONFIG, recipe, "reference"))(params)
    for (path, a), b in zip(flat_params(q_tri).items(), jax.tree.leaves(q_ref)):
        np.testing.assert_array_equal(np.asarray(a).reshape(-1).view(np.uint8), np.asarray(b).reshape(-1).view(np.uint8), err_msg=path)
    phase("weight sync equal")

    def logits(impl):
        return jax.jit(lambda p: forward(graphdef, p, seqs[:, :-1], recipe, key=KEY, impl=impl)[0])(params)

    np.testing.assert_array_equal(np.asarray(logits("triton")), np.asarray(logits("reference")))
    phase("forward equal")
    (g_tri, logits_tri) = step("triton")(seeds)
    phase("triton training step ran")
    (g_ref, logits_ref) = step("reference")(seeds)
    phase("reference training step ran")
    np.testing.assert_array_equal(np.asarray(logits_tri), np.asarray(logits_ref))
    differing = {path: int(np.sum(np.asarray(a) != np.asarray(b)))  # every differing leaf, not just the first
                 for (path, a), b in zip(flat_params(g_tri).items(), jax.tree.leaves(g_ref))
                 if np.asarray(a).tobytes() != np.asarray(b).tobytes()}
    assert not differing, f"gradients differ (leaf: elements): {differing}"
