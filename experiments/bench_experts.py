"""Benchmark of the dropless expert GEMM on the GPU (a 128-expert MoE layer's shape).

    python -m experiments.bench_experts [--tokens=16384 --d_in=2048 --d_out=768 --experts=128]
    python -m experiments.bench_experts --moe_block_only --profile=runs/moe_trace   # where a block's time goes

16384 routed rows x [2048 -> 768] with 128 experts, bf16, random group sizes (multiples of 32,
as the model pads them). Compared in one run, each checked against a per-expert f32 loop
before it is timed:
- `lax.ragged_dot` (what `fp4rl.grouped.ragged_matmul` lowers to),
- JAX's Mosaic GPU grouped matmul (`pallas/ops/gpu/ragged_dot_mgpu.py`, fixed tile config),
- our vendored copy of it (`pallas_kernels.grouped_gemm.grouped_matmul`: f32 output, rows past
  the groups zeroed; what `gemm="mosaic"` runs),
- a dense batched einsum over equal-size groups (capacity = max group; drops nothing here
  but computes the padding; the upper bound of what a grouped kernel can reach),
- `qdot` forward with the `full` recipe's routed-expert site (NVFP4 4/6 emulation: the
  activation and weight quantizers plus the grouped GEMM),
- forward + dgrad + wgrad of the layer (`jax.vjp` of a ragged `qdot`: y, dx, dw, each checked)
  with the expert GEMMs on each backend of `--gemms`, for a BF16 site (the three
  GEMMs alone) and the `full` recipe's site (NVFP4 forward, dequantized backward): issue #17's
  targets,
- the h200 preset's whole MoE block (router, dispatch, gate|up and down experts, shared expert;
  tokens = rows / top_k) under `jax.value_and_grad`, on each backend of `--gemms` (the first is
  the reference; default xla, mosaic, packed, packed_dgrad; bf16 rows once per distinct bf16
  GEMM, as the packed backends run theirs as mosaic), bf16 and `full` recipes; each row
  is checked against the reference row (relative norm of the difference of all gradients), the
  reference row for finiteness.
`--profile DIR`: each timed MoE-block row runs once more under the JAX profiler (trace in
DIR/<recipe>-<gemm>), and the table says which kernels its time went to (`fp4rl.analysis.
trace_summary`): what separates the `full` block from the bf16 one. `--moe_block_only` skips the
GEMM rows.
TFLOP/s counts 2 * rows * d_in * d_out useful FLOPs per GEMM (three for fwd+bwd rows; the MoE
block rows count its routed-expert GEMMs only); the bf16 dense peak of an H200 is ~989.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from flax import nnx

from fp4rl import grouped, qlinear
from fp4rl.analysis import trace_summary
from experiments.gpu_bench import bench_main, median_seconds
from fp4rl.model.config import ModelConfig
from fp4rl.model.moe import MoE
from fp4rl.model.sites import Ctx
from fp4rl.recipe import PrecisionRecipe, SiteConfig

H200_BF16_PEAK_TFLOPS = 989.0


@dataclasses.dataclass(frozen=True)
class ExpertBenchConfig:
    tokens: int = 16384
    d_in: int = 2048
    d_out: int = 768
    experts: int = 128
    iters: int = 20
    # expert GEMM backends timed in the fwd+bwd and MoE-block rows; the first is the reference
    gemms: str = "xla,mosaic,packed,packed_dgrad,packed_wgmma"
    profile: str = ""  # a directory: profile each timed MoE-block row once more there ("": no profile)
    moe_block_only: bool = False  # only the MoE-block rows (e.g. for a profile)
    out: str = "benchmarks"


def _group_sizes(config, key):
    """Random sizes, multiples of 32, summing to `tokens` (rows are pre-sorted by expert)."""
    units = config.tokens // 32
    cuts = np.sort(np.asarray(jax.random.randint(key, (config.experts - 1,), 0, units + 1)))
    sizes = np.diff(np.concatenate([[0], cuts, [units]])) * 32
    return jnp.asarray(sizes, jnp.int32)


def _max_rel(out, ref) -> float:
    return float(np.max(np.abs(np.asarray(out, np.float32) - ref)) / np.max(np.abs(ref)))


def _measure(name, fn, args, check, iters: int, flops: float) -> dict:
    """One table row: run, `check(outputs) -> (error, ok)`, and time only what passed."""
    row = {"name": name}
    try:
        row["max_rel_err"], row["checked"] = check(fn(*args))
        if row["checked"]:
            seconds = median_seconds(fn, *args, iters=iters)
            row.update(ms=seconds * 1e3, tflops=flops / seconds / 1e12)
    except Exception as e:  # noqa: BLE001  (recorded: what failed and why)
        row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
    print(row, flush=True)
    return row


def _backends(config: ExpertBenchConfig) -> tuple[str, ...]:
    """`--gemms` checked against `fp4rl.grouped.GEMMS`."""
    gemms = tuple(config.gemms.split(","))
    unknown = [g for g in gemms if g not in grouped.GEMMS]
    if unknown:
        raise SystemExit(f"bench_experts: unknown --gemms {unknown}; valid: {', '.join(grouped.GEMMS)}")
    return gemms


def _bf16_backends(gemms: tuple[str, ...]) -> tuple[str, ...]:
    """One backend per distinct bf16 GEMM: the packed backends run their bf16 GEMMs as "mosaic"
    does (`grouped.PACKED_GEMMS`), so a bf16 row of each would time the same program again."""
    first_of = {}
    for gemm in gemms:
        first_of.setdefault(grouped.PACKED_GEMMS.get(gemm, gemm), gemm)
    return tuple(first_of.values())


def _moe_block_rows(config: ExpertBenchConfig, gemms: tuple[str, ...], key) -> list[dict]:
    """The h200 MoE block, forward + backward, on each of `gemms` (see the docstring)."""
    model = ModelConfig.from_name("h200")
    tokens = config.tokens // model.top_k
    kx, kg = jax.random.split(key)
    x = jax.random.normal(kx, (1, tokens, model.d_model), jnp.bfloat16)
    g = jax.random.normal(kg, (1, tokens, model.d_model), jnp.float32)
    valid = jnp.ones((1, tokens), bool)
    routed_flops = 3 * 2 * tokens * model.top_k * 3 * model.d_model * model.moe_d_ff
    rows = []
    for recipe_name in ("bf16", "full"):
        ctx = Ctx(recipe=PrecisionRecipe.from_name(recipe_name), num_layers=model.num_layers, impl="auto")
        reference = None
        for gemm in (_bf16_backends(gemms) if recipe_name == "bf16" else gemms):
            graphdef, state = nnx.split(MoE(dataclasses.replace(model, expert_gemm=gemm), 0, nnx.Rngs(0)))

            def loss(state, x, graphdef=graphdef, ctx=ctx):
                y, _, aux, _ = nnx.merge(graphdef, state)(x, valid, ctx)
                return jnp.sum(y.astype(jnp.float32) * g) + aux

            fn = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))

            def check(out, gemm=gemm):
                nonlocal reference
                leaves = [np.asarray(v, np.float32) for v in jax.tree.leaves(out)]
                if reference is None:  # the first backend is the reference
                    reference = leaves
                    return 0.0, all(np.isfinite(v).all() for v in leaves)
                err = max(float(np.linalg.norm(v - r) / max(np.linalg.norm(r), 1e-30)) for v, r in zip(leaves, reference))
                return err, err < 1e-2  # bf16 outputs: ~2^-8 per element, far less in norm

            name = f"MoE block (h200, {tokens} tokens) fwd+bwd, {recipe_name} recipe, expert_gemm={gemm}"
            row = _measure(name, fn, (state, x), check, config.iters, routed_flops)
            if config.profile and "ms" in row:
                log_dir = f"{config.profile}/{recipe_name}-{gemm}"
                row["trace"] = trace_summary.profile_call(
                    fn, (state, x), log_dir, title=f"Where the time of one `{name}` call goes (trace: {log_dir})")
            rows.append(row)
    return rows


def run(config: ExpertBenchConfig) -> dict:
    gemms = _backends(config)
    kx, kw, kg = jax.random.split(jax.random.key(0), 3)
    rows = [] if config.moe_block_only else _gemm_rows(config, gemms, kx, kw, kg)
    rows += _moe_block_rows(config, gemms, jax.random.fold_in(kx, 2))
    return {"device": str(jax.devices()[0].device_kind), "config": dataclasses.asdict(config), "rows": rows}


def _gemm_rows(config: ExpertBenchConfig, gemms: tuple[str, ...], kx, kw, kg) -> list[dict]:
    """The GEMM rows (see the docstring), each checked against the per-expert f32 loop."""
    x = jax.random.normal(kx, (config.tokens, config.d_in), jnp.bfloat16)
    w = (jax.random.normal(kw, (config.experts, config.d_in, config.d_out)) * 0.02).astype(jnp.bfloat16)
    sizes = _group_sizes(config, kg)
    flops = 2 * config.tokens * config.d_in * config.d_out
    starts = np.concatenate([[0], np.cumsum(np.asarray(sizes))[:-1]])
    groups = [(e, s, n) for e, (s, n) in enumerate(zip(starts, np.asarray(sizes)))]
    x32, w32 = np.asarray(x, np.float32), np.asarray(w, np.float32)
    reference = np.concatenate([x32[s : s + n] @ w32[e] for e, s, n in groups])
    g = jax.random.normal(jax.random.fold_in(kx, 1), (config.tokens, config.d_out), jnp.bfloat16)  # the cotangent
    g32 = np.asarray(g, np.float32)
    grad_reference = (reference, np.concatenate([g32[s : s + n] @ w32[e].T for e, s, n in groups]),
                      np.stack([x32[s : s + n].T @ g32[s : s + n] for e, s, n in groups]))
    capacity = int(np.max(np.asarray(sizes)))

    def dense_equal_groups(x, w):
        idx = jnp.asarray(starts)[:, None] + jnp.arange(capacity)[None, :]
        valid = jnp.arange(capacity)[None, :] < sizes[:, None]
        xg = jnp.where(valid[..., None], x[jnp.minimum(idx, config.tokens - 1)], 0)
        yg = jnp.einsum("eck,ekn->ecn", xg, w, preferred_element_type=jnp.float32)
        return jnp.zeros((config.tokens, config.d_out), jnp.float32).at[jnp.where(valid, idx, config.tokens)].set(yg, mode="drop")

    candidates = {
        "lax.ragged_dot": jax.jit(lambda x, w: grouped.ragged_matmul(x, w, sizes)),
        "dense einsum, equal groups": jax.jit(dense_equal_groups),
    }
    try:
        from jax.experimental.pallas.ops.gpu import ragged_dot_mgpu

        candidates["ragged_dot_mgpu (Mosaic GPU)"] = jax.jit(functools.partial(
            ragged_dot_mgpu.ragged_dot, group_sizes=sizes, block_m=128, block_n=128, block_k=64,
            max_concurrent_steps=4, grid_block_n=2))
    except Exception as e:  # noqa: BLE001
        print(f"ragged_dot_mgpu unavailable: {e}")
    site = PrecisionRecipe.from_name("full").site("routed_experts", 0, 8)
    candidates["qdot full recipe (NVFP4 4/6 emulation, fwd)"] = jax.jit(
        lambda x, w: qlinear.qdot(x, w, site, group_sizes=sizes).astype(jnp.float32))
    try:
        from pallas_kernels.grouped_gemm import grouped_matmul

        candidates["grouped_matmul (vendored Mosaic GPU, f32 out, fwd)"] = jax.jit(lambda x, w: grouped_matmul(x, w, sizes))
    except Exception as e:  # noqa: BLE001
        print(f"pallas_kernels.grouped_gemm unavailable: {e}")

    def fwd_bwd(site, gemm):
        def fn(x, w):
            y, pull = jax.vjp(lambda x, w: qlinear.qdot(x, w, site, group_sizes=sizes, gemm=gemm), x, w)
            return (y, *pull(g))
        return jax.jit(fn)

    grad_candidates = {f"fwd+dgrad+wgrad, {label} site, gemm={gemm}": fwd_bwd(s, gemm)
                       for label, s, backends in (("BF16", SiteConfig(), _bf16_backends(gemms)),
                                                  ("full recipe (NVFP4, dequantized bwd)", site, gemms))
                       for gemm in backends}

    rows = []
    for name, fn in {**candidates, **grad_candidates}.items():
        is_grad = name in grad_candidates
        # bf16 output rounding (2^-8) bounds the exact paths; NVFP4 emulation is a different
        # (quantized) product, checked for sanity only (its relative error is ~10%).
        tolerance = 0.5 if "NVFP4" in name else 1e-2

        def check(outs, is_grad=is_grad, tolerance=tolerance):
            err = max(_max_rel(o, r) for o, r in (zip(outs, grad_reference) if is_grad else [(outs, reference)]))
            return err, err < tolerance

        rows.append(_measure(name, fn, (x, w), check, config.iters, (3 if is_grad else 1) * flops))
    return rows


def _gemms_flag(gemms: str) -> str:
    return "" if gemms == ExpertBenchConfig.gemms else f" --gemms={gemms}"


def to_markdown(result) -> str:
    c = result["config"]
    lines = [f"# Dropless expert GEMM, {c['tokens']} rows x [{c['d_in']} -> {c['d_out']}], {c['experts']} experts, bf16", "",
             f"Device: {result['device']}. Command: `python -m experiments.bench_experts{_gemms_flag(c['gemms'])}`. Peak bf16 dense: ~{H200_BF16_PEAK_TFLOPS:.0f} TFLOP/s.", "",
             f"| implementation | rel err (GEMMs: max vs f32 loop; MoE block: norm vs {c['gemms'].split(',')[0]}) | ms | TFLOP/s | % of peak |",
             "|---|---|---|---|---|"]
    for r in result["rows"]:
        if "error" in r:
            lines.append(f"| {r['name']} | error: {r['error']} | | | |")
        elif not r["checked"]:
            lines.append(f"| {r['name']} | {r['max_rel_err']:.2e} (FAILED check, not timed) | | | |")
        else:
            lines.append(f"| {r['name']} | {r['max_rel_err']:.2e} | {r['ms']:.3f} | {r['tflops']:.1f} | {100 * r['tflops'] / H200_BF16_PEAK_TFLOPS:.1f}% |")
    lines += ["\n" + r["trace"] for r in result["rows"] if "trace" in r]
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    bench_main("bench_experts", ExpertBenchConfig, run, to_markdown, argv)


if __name__ == "__main__":
    main()
