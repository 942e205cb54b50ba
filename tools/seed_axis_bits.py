"""Are a seed's results the same bits whatever the number of seeds vmapped beside it?

    python tools/seed_axis_bits.py [--preset P] [--arm A] [--seeds 1,2,4] [--init DIR] [--ops N]
    (on a GPU machine, from the repository root: PYTHONPATH=. python tools/seed_axis_bits.py)

An RL arm runs its seeds as one vmapped program (docs/rl.md, "Sampler and trainer"), so the batch
that XLA compiles for grows with the number of seeds. For each S in `--seeds` this builds the
trainer of `--preset` (`Trainer`, as tools/program_digest.py does: the preset's model with random
parameters, or the warm-up in `--init`) with S seeds, gives every seed the same parameters, the
same prompts (the held-out evaluation's first batch) and the same keys, and compares each seed's
outputs with those of S = the first of `--seeds`, byte for byte, in the order they are computed:
the synced weights, the forward's logits on the prompts, the greedy sampler's tokens and log-probs
(the held-out evaluation), and the sampler's at the rollout temperature.

Then (`--ops`, the first N differences; 0 skips it) it walks that forward one primitive at a time,
each primitive compiled alone and vmapped over S copies of the same inputs (the reference's
outputs feed the next one), and names the first primitives whose output for some seed differs,
with their source lines: the ops whose code XLA picks by the batch size. Compiled outputs that
differ while no op does point at the fusion of several ops instead.
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
from jax._src import source_info_util
from jax.extend import core as jcore

from fp4rl import configs
from fp4rl.model import init
from fp4rl.model.transformer import forward
from fp4rl.rl import sft, trainer

# Primitives whose body is walked op by op: calls whose values are their body's (custom_vmap_call
# is not: its own batching rule, e.g. the grouped GEMM's folding of the seeds, is what runs).
CALL_BODIES = {"pjit": "jaxpr", "jit": "jaxpr", "closed_call": "call_jaxpr", "core_call": "call_jaxpr",
               "custom_jvp_call": "call_jaxpr", "custom_vjp_call": "call_jaxpr", "checkpoint": "jaxpr",
               "remat": "jaxpr"}


def _warmup(preset: str, init_dir: str | None):
    """(graphdef, params, meta) as `Trainer` takes them: the warm-up in `init_dir`, else the
    preset's model with random parameters (rounding, not accuracy, is under test)."""
    if init_dir:
        return sft.load(init_dir)
    model_config = sft.model_config(configs.SFT_PRESETS[preset])
    graphdef, params = init(model_config, 0)
    return graphdef, params, {"model_config": dataclasses.asdict(model_config)}


def _trainer(preset: str, arm: str, seeds: int, warmup) -> trainer.Trainer:
    config = dataclasses.replace(configs.RL_PRESETS[preset], arm=arm, seeds=seeds, out=tempfile.mkdtemp())
    run = trainer.Trainer(config, progress=False, warmup=warmup)
    if not run.eval_batches:
        raise ValueError(f"preset {preset!r} has no held-out evaluation (eval_every=0): its prompts are the ones compared")
    return run


def _outputs(run: trainer.Trainer) -> dict[str, np.ndarray]:
    """Every seed's outputs, [S, ...] each, from identical parameters, prompts and keys."""
    S, c = len(run.seeds), run.config
    ids, mask, _ = run.eval_batches[0]
    ids, mask = np.stack([ids] * S).astype(np.int32), np.stack([mask] * S).astype(bool)
    state = run._initial_state()
    qparams, _ = run.programs.sync(state["params"])
    recipe = run.recipe.forward_only()
    logits = jax.jit(jax.vmap(lambda q, t, v: forward(run.graphdef, q, t, recipe, impl=c.impl, valid=v)[0]))
    keys = run.programs.put(jnp.stack([jax.random.key(0)] * S))
    greedy = run.programs.generate(qparams, ids, mask, keys, jnp.float32(0.0))
    sampled = run.programs.generate(qparams, ids, mask, keys, jnp.float32(c.temperature))
    weights = [np.ascontiguousarray(x).reshape(S, -1).view(np.uint8) for x in jax.device_get(jax.tree.leaves(qparams))]
    named = [("synced weights", np.concatenate(weights, axis=1)),
             ("logits (prompt forward)", logits(qparams, run.programs.put(ids), run.programs.put(mask))),
             ("greedy tokens", greedy.tokens), ("greedy log-probs", greedy.logprobs),
             (f"sampled tokens (T={c.temperature:g}, same key)", sampled.tokens),
             (f"sampled log-probs (T={c.temperature:g})", sampled.logprobs)]
    return {name: np.asarray(jax.device_get(values)) for name, values in named}


def difference(got: np.ndarray, want: np.ndarray) -> str | None:
    """None when the bytes are equal, else how many values differ, by how much, and the first."""
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape:
        return f"shape {got.shape} != {want.shape}"
    if got.tobytes() == want.tobytes():
        return None
    differs = got != want
    if got.dtype.kind == "f":
        differs |= np.signbit(got) != np.signbit(want)
        differs &= ~(np.isnan(got) & np.isnan(want))
    first = tuple(int(i) for i in np.argwhere(differs)[0])
    size = f"max |diff| {np.abs(got.astype(np.float64) - want.astype(np.float64)).max():.3g}, " if got.dtype.kind == "f" else ""
    return f"{int(differs.sum())} of {differs.size} differ ({size}first at {first}: {got[first]} vs {want[first]})"


def _cell(outputs: np.ndarray, reference: np.ndarray) -> str:
    """Every seed of an S-seed program against the reference's seed 0."""
    diffs = {k: difference(outputs[k], reference) for k in range(outputs.shape[0])}
    bad = {k: d for k, d in diffs.items() if d}
    if not bad:
        return "same"
    same_slots = len({outputs[k].tobytes() for k in bad}) == 1
    return (f"seeds {sorted(bad)} differ ({'alike' if same_slots else 'unlike'} each other); "
            f"seed {min(bad)}: {bad[min(bad)]}")


def compare_programs(preset: str, arm: str, sizes: list[int], warmup) -> bool:
    """Print one row per output, one column per S; True when every seed matched the reference."""
    outputs = {S: _outputs(_trainer(preset, arm, S, warmup)) for S in sizes}
    reference = {name: values[0] for name, values in outputs[sizes[0]].items()}
    others = sizes[1:]
    print(f"| output (against S={sizes[0]}, seed 0) | " + " | ".join(f"S={S}" for S in others) + " |")
    print("|---|" + "---|" * len(others))
    same = True
    for name in reference:
        cells = [_cell(outputs[S][name], reference[name]) for S in others]
        same &= all(cell == "same" for cell in cells)
        print(f"| {name} | " + " | ".join(cells) + " |", flush=True)
    return same


def _run_alone(eqn, values, S: int) -> list[np.ndarray]:
    """The primitive of `eqn` compiled alone, vmapped over S copies of `values`: [S, ...] outputs."""
    def one(*xs):
        out = eqn.primitive.bind(*xs, **eqn.params)
        return out if eqn.primitive.multiple_results else [out]

    return jax.device_get(jax.jit(jax.vmap(one, axis_size=S))(*[jnp.stack([x] * S) for x in values]))


class OpWalk:
    """Evaluates a jaxpr primitive by primitive at every S, recording the first `limit` whose
    outputs differ from S = sizes[0]'s; the reference's outputs feed the next primitive."""

    def __init__(self, sizes: list[int], limit: int):
        self.sizes, self.limit, self.found = sizes, limit, []

    def run(self, jaxpr, consts, args) -> list:
        env = dict(zip(jaxpr.constvars, consts)) | dict(zip(jaxpr.invars, args))
        read = lambda v: v.val if isinstance(v, jcore.Literal) else env[v]  # noqa: E731
        for eqn in jaxpr.eqns:
            if len(self.found) >= self.limit:
                return []
            values = [read(v) for v in eqn.invars]
            body = eqn.params.get(CALL_BODIES.get(eqn.primitive.name, ""))
            outs = self.run(*_open(body), values) if body is not None else self._compare(eqn, values)
            env.update((v, o) for v, o in zip(eqn.outvars, outs) if not isinstance(v, jcore.DropVar))
        return [read(v) for v in jaxpr.outvars]

    def _compare(self, eqn, values) -> list:
        reference = [r[0] for r in _run_alone(eqn, values, self.sizes[0])]
        for S in self.sizes[1:]:
            for i, (got, want) in enumerate(zip(_run_alone(eqn, values, S), reference)):
                bad = [(k, d) for k in range(S) if (d := difference(got[k], want))]
                if bad and len(self.found) < self.limit:
                    where = source_info_util.summarize(eqn.source_info)
                    self.found.append(f"{eqn.primitive.name} (output {i}, {want.dtype}{list(want.shape)}) at {where}: "
                                      f"S={S}, seeds {[k for k, _ in bad]}; seed {bad[0][0]}: {bad[0][1]}")
        return reference


def _open(body):
    """(jaxpr, consts) of a ClosedJaxpr or an open Jaxpr."""
    return (body.jaxpr, body.consts) if hasattr(body, "consts") else (body, [])


def walk_forward(preset: str, arm: str, sizes: list[int], warmup, limit: int) -> list[str]:
    """The first `limit` primitives of the prompt forward whose batched output depends on S."""
    run = _trainer(preset, arm, 1, warmup)
    ids, mask, _ = run.eval_batches[0]
    qparams = jax.tree.map(lambda x: x[0], run.programs.sync(run._initial_state()["params"])[0])
    recipe = run.recipe.forward_only()

    def logits(q, tokens, valid):  # layers unrolled: a scan would be one opaque primitive
        return forward(run.graphdef, q, tokens, recipe, impl=run.config.impl, valid=valid, scan_layers=False)[0]

    closed = jax.make_jaxpr(logits)(qparams, jnp.asarray(ids, jnp.int32), jnp.asarray(mask, bool))
    walk = OpWalk(sizes, limit)
    walk.run(closed.jaxpr, closed.consts, jax.tree.leaves((qparams, jnp.asarray(ids, jnp.int32), jnp.asarray(mask, bool))))
    return walk.found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default=None,
                        help="RL preset (fp4rl.configs.RL_PRESETS); default: h200-chain on a GPU, smoke elsewhere")
    parser.add_argument("--arm", default="bf16")
    parser.add_argument("--seeds", default="1,2,4", help="the numbers of vmapped seeds; the first is the reference")
    parser.add_argument("--init", default=None, help="a warm-up directory (default: random parameters)")
    parser.add_argument("--ops", type=int, default=1, help="report the first N ops that differ (0: no op walk)")
    args = parser.parse_args()
    preset = args.preset or ("h200-chain" if jax.default_backend() == "gpu" else "smoke")
    sizes = [int(s) for s in args.seeds.split(",")]
    if len(sizes) < 2 or min(sizes) < 1:
        raise ValueError(f"--seeds={args.seeds!r}: give at least two numbers of seeds >= 1, the reference first")
    warmup = _warmup(preset, args.init)
    print(f"{preset}, arm {args.arm}, seeds {sizes} vmapped, on {jax.default_backend()} ({jax.devices()[0].device_kind}):")
    same = compare_programs(preset, args.arm, sizes, warmup)
    print("every seed's outputs are the same bits for every number of seeds" if same else
          "some seed's outputs depend on the number of vmapped seeds")
    if args.ops:
        found = walk_forward(preset, args.arm, sizes, warmup, args.ops)
        print("\n".join(["ops of the forward whose output depends on the number of seeds:", *found]) if found else
              "no op of the forward, compiled alone, depends on the number of seeds")


if __name__ == "__main__":
    main()
