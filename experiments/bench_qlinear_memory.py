"""Memory of qdot's forward+backward per backward mode, from XLA's compiled memory analysis.

The proxy layer of the seed: x [2048, 2048] (tokens x in) @ w [2048, 8192], bf16. Baseline: a
straightforward custom_vjp that saves bf16 x, w and both dequantized operands (what an
implementation does when it keeps the dequantized tensors for the backward). The
TransformerEngine change this mirrors went from 150 MB to 45 MB.

Reported per mode:
- residual bytes: what the forward saves for the backward (the jitted forward returns them).
  This is the quantity the target (dequantized <= 0.35x baseline) and the TE figure are about:
  in a deep network it is held for every layer between its forward and its backward;
- temp bytes of the compiled forward and backward programs (the quantizers' intermediates);
- fwd+bwd peak: max over the two programs of argument + output + temp bytes. Every variant
  shares the layer's own inputs and outputs (x, w, g, y, dx, dw: 144 MiB at the default
  shape), which bounds this ratio from below.

    python -m experiments.bench_qlinear_memory [--tokens=2048 --d_in=2048 --d_out=8192]
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jax
import jax.numpy as jnp

from fp4rl import qlinear
from fp4rl.config_cli import cli
from fp4rl.formats import nvfp4
from fp4rl.recipe import SiteConfig


@dataclasses.dataclass(frozen=True)
class MemoryBenchConfig:
    tokens: int = 2048
    d_in: int = 2048
    d_out: int = 8192
    out: str = "benchmarks"


def baseline_dot(site: SiteConfig):
    """Straightforward custom_vjp: saves bf16 x, w, DQ(Q(x)), DQ(Q(w))."""

    @jax.custom_vjp
    def f(x, w):
        return qlinear.qdot(x, w, site)

    def fwd(x, w):
        x_dq = nvfp4.dequantize(nvfp4.quantize(x, site.act_config()), jnp.bfloat16)
        w_dq = nvfp4.dequantize(nvfp4.quantize(w.T, site.weight_config()), jnp.bfloat16).T
        return qlinear.qdot(x, w, site), (x.astype(jnp.bfloat16), w.astype(jnp.bfloat16), x_dq, w_dq)

    def bwd(res, g):
        x, w, x_dq, w_dq = res
        dx = jnp.matmul(g, w_dq.T, preferred_element_type=jnp.float32).astype(x.dtype)
        dw = jax.lax.dot_general(x_dq, g, (([0], [0]), ([], [])), preferred_element_type=jnp.float32).astype(w.dtype)
        return dx, dw

    f.defvjp(fwd, bwd)
    return f


def _bytes(tree) -> int:
    return sum(leaf.size * leaf.dtype.itemsize for leaf in jax.tree.leaves(tree))


def _program_bytes(compiled) -> int:
    m = compiled.memory_analysis()
    return m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes - m.alias_size_in_bytes


def measure(fn, x, w, g) -> dict:
    fwd = jax.jit(lambda x, w: jax.vjp(fn, x, w))
    _, vjp_fn = jax.eval_shape(fwd, x, w)
    residual_leaves = jax.tree.leaves(vjp_fn)
    y, vjp_concrete = fwd(x, w)
    bwd = jax.jit(lambda vjp_fn, g: vjp_fn(g))
    fwd_c, bwd_c = fwd.lower(x, w).compile(), bwd.lower(vjp_concrete, g).compile()
    return {
        "residual_bytes": _bytes(residual_leaves),
        "forward_temp_bytes": fwd_c.memory_analysis().temp_size_in_bytes,
        "backward_temp_bytes": bwd_c.memory_analysis().temp_size_in_bytes,
        "peak_bytes": max(_program_bytes(fwd_c), _program_bytes(bwd_c)),
    }


def run(config: MemoryBenchConfig) -> list[dict]:
    kx, kw, kg = jax.random.split(jax.random.key(0), 3)
    x = jax.random.normal(kx, (config.tokens, config.d_in), jnp.bfloat16)
    w = (jax.random.normal(kw, (config.d_in, config.d_out)) * 0.02).astype(jnp.bfloat16)
    g = jax.random.normal(kg, (config.tokens, config.d_out), jnp.bfloat16)
    key = jax.random.key(1)
    rows = []
    base_site = SiteConfig(format="nvfp4", backward="dequantized")
    candidates = [("baseline (saves bf16 x, w, DQ(x), DQ(w))", baseline_dot(base_site))]
    for mode in ("bf16", "dequantized", "quantized"):
        site = SiteConfig(format="nvfp4", backward=mode)
        candidates.append((f"qdot backward={mode}", lambda x, w, site=site: qlinear.qdot(x, w, site, key=key)))
    for name, fn in candidates:
        rows.append({"name": name, **measure(fn, x, w, g)})
    base = rows[0]
    for row in rows:
        row["residual_ratio"] = row["residual_bytes"] / base["residual_bytes"]
        row["peak_ratio"] = row["peak_bytes"] / base["peak_bytes"]
    return rows


def to_markdown(rows, config: MemoryBenchConfig, device: str) -> str:
    mib = lambda b: f"{b / 2**20:.1f}"  # noqa: E731
    lines = [
        f"# qdot memory, proxy layer x[{config.tokens}x{config.d_in}] @ w[{config.d_in}x{config.d_out}] bf16",
        "",
        f"Device: {device}. Command: `python -m experiments.bench_qlinear_memory`.",
        "",
        "| variant | residuals MiB | residuals / baseline | fwd temp MiB | bwd temp MiB | fwd+bwd peak MiB | peak / baseline |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['name']} | {mib(r['residual_bytes'])} | {r['residual_ratio']:.3f} | {mib(r['forward_temp_bytes'])} | "
            f"{mib(r['backward_temp_bytes'])} | {mib(r['peak_bytes'])} | {r['peak_ratio']:.3f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    config = cli(MemoryBenchConfig, argv=argv)
    device = str(jax.devices()[0].device_kind)
    print(f"devices: {jax.devices()}")
    rows = run(config)
    text = to_markdown(rows, config, device)
    print(text)
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    tag = jax.default_backend()
    (out / f"qlinear_memory_{tag}.md").write_text(text)
    (out / f"qlinear_memory_{tag}.json").write_text(json.dumps({"config": dataclasses.asdict(config), "device": device, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
