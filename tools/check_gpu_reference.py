"""Do the XLA:GPU jnp reference and the Triton kernel follow docs/numerics.md on the GPU?

    python tools/check_gpu_reference.py   # on a GPU machine; prints mismatch counts vs the NumPy oracle
    XLA_FLAGS=--xla_backend_extra_options=-nvptx-prec-divf32=3 python tools/check_gpu_reference.py

The oracle (`tests/formats/oracle.py`, NumPy float32 + ml_dtypes) is the independent judge.
Before `ieee.integer_divide` the XLA:GPU reference differed on 4/6-exact activations (its f32
division is approximate there); the expert-stack rows check the vmapped 2D form as well, the
per-tensor rows the quantized backward's gradients (with stochastic rounding: the oracle given the
same draws). The second command asks XLA for IEEE f32 division (`fp4rl.xla_flags.IEEE_GPU_DIVISION`),
under which the reference divides natively: every row must then show 0 mismatches too. The first
line says which division the reference traced.
"""

import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import pallas_kernels  # noqa: E402
from fp4rl import xla_flags  # noqa: E402
from fp4rl.formats import nvfp4  # noqa: E402
from tests.formats import oracle  # noqa: E402


def count_mismatches(t, ref) -> dict:
    return {
        "codes": int((np.asarray(t.codes) != ref.codes).sum()),
        "scales": int((np.asarray(t.scales).view(np.uint8) != ref.scales).sum()),
        "map4": int((np.asarray(t.map4) != ref.map4).sum()),
    }


def main():
    print(jax.devices(), "reference division:", "native (IEEE_GPU_DIVISION)" if xla_flags.ieee_gpu_division()
          else "integer long division")
    x = np.asarray(jax.random.normal(jax.random.key(0), (2048, 2048), jnp.bfloat16).astype(jnp.float32))
    w = np.asarray((jax.random.normal(jax.random.key(1), (4, 768, 2048)) * 0.02).astype(jnp.bfloat16).astype(jnp.float32))
    cases = [("act per-token 4/6 exact", x, dict(scale="token", four_over_six="mae")),
             ("act per-token 4/6 fast", x, dict(scale="token", four_over_six="mae", fast_error=True)),
             ("weight 2D plain (expert 0)", w[0], dict(block_2d=True)),
             ("weight 2D 4/6 exact (expert 0)", w[0], dict(block_2d=True, four_over_six="mae"))]
    cases += [("act per-token 4/6 exact MSE E=448", x, dict(scale="token", four_over_six="mse", e4m3_max=448)),
              ("grad per-tensor", x * np.float32(1e-3), dict(scale="tensor")),
              ("grad per-tensor, stochastic rounding", x * np.float32(1e-3), dict(scale="tensor", sr=True))]
    key = jax.random.key(2)
    for name, v, kw in cases:
        sr = kw.pop("sr", False)
        config = nvfp4.NVFP4Config(**kw)
        uniform = jax.random.uniform(key, v.shape, jnp.float32) if sr else None
        ref = oracle.quantize_nvfp4(v, **kw, uniform=None if uniform is None else np.asarray(uniform))
        xla = jax.jit(lambda a: nvfp4.quantize(a, config, sr_key=key if sr else None))(jnp.asarray(v))
        tri = pallas_kernels.quantize(jnp.asarray(v), config, backend="triton", uniform=uniform)
        print(f"{name}: XLA:GPU reference vs oracle {count_mismatches(xla, ref)}; Triton vs oracle {count_mismatches(tri, ref)}", flush=True)
    # The expert stack [E, K, N] as qdot holds it, quantized along K per expert (bench_quant's weights).
    w_kn = jnp.swapaxes(jnp.asarray(w), 1, 2)
    for variant, kw in (("plain", {}), ("4/6 exact", dict(four_over_six="mae")), ("4/6 fast", dict(four_over_six="mae", fast_error=True))):
        config = nvfp4.NVFP4Config(block_2d=True, **kw)
        xla = jax.jit(jax.vmap(lambda m: nvfp4.quantize(m, config)))(jnp.swapaxes(w_kn, 1, 2))
        tri = pallas_kernels.quantize_experts(w_kn, config, backend="triton", contraction_axis=1)
        for e in range(w.shape[0]):
            ref = oracle.quantize_nvfp4(w[e], block_2d=True, **kw)
            pick = lambda t: jax.tree.map(lambda a: a[e], t)  # noqa: E731
            print(f"expert stack 2D {variant} expert {e}: XLA:GPU reference vs oracle {count_mismatches(pick(xla), ref)}; "
                  f"Triton vs oracle {count_mismatches(pick(tri), ref)}", flush=True)


if __name__ == "__main__":
    main()
