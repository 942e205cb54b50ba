"""The shared kernel suite run on the pure-jnp reference `fp4rl.formats.nvfp4` itself.

Its oracle is independent (NumPy float32 + ml_dtypes + docs/numerics.md's hand vectors), so this
file is what makes the reference trustworthy as the kernels' byte-exact target.
"""

from tests.kernels.quant_suite import REFERENCE, QuantSuite


class TestReference(QuantSuite):
    impl = REFERENCE
