"""Deployment correlation: one trained checkpoint served as BF16, MXFP8 (the FP8 deployment) and
online NVFP4, scored on the same held-out prompts; do the deployments' scores agree?

The seed's side result: a checkpoint trained with the NVFP4 recipe is served as online NVFP4
(quantized at load time, no calibration) and its scores correlate with the FP8 deployment's.
Here every deployment answers the same prompts, so its per-prompt scores pair up:

- prompts: the RL task (`fp4rl.rl.task`), `per_level` problems for each number of operations in
  `task` (each level separately), from stream `task_seed`, which neither the warm-up (0), the RL
  data (0) nor RL's held-out evaluation (1_000_003) draws from;
- single turn: greedy (one answer, 0/1) and sampled (`samples` answers at `temperature`, the
  share correct) per prompt;
- multi-turn: the model's boxed answer to the first question is fed back as the given of a
  follow-up (`followup`, e.g. `a=<answer>. b=a+3. What is b?`), whose truth is computed from the
  first question's true answer: the follow-up is right only when both turns are (a first answer
  with no integer in its box fails the follow-up without generating it);
- keys: every deployment draws row (prompt i, sample j) with the same key, so sampling noise is
  shared and the correlations measure what the quantization changes. The retest replicate
  (`retest`) answers with the first deployment again under independent keys: the agreement that
  sampling alone leaves, to read the others against (greedy scores have no retest: they repeat).

Per metric and pair of deployments: Pearson and Spearman correlation of per-prompt scores with
bootstrap CIs over prompts; per deployment: accuracy with its CI, per difficulty too, and the
generation throughput (tokens/s of the batches, compile excluded). Writes `serve_eval.json`,
`report.md` and `serve_eval.png` under `out`.

Longer than ~400 lines because prompts, follow-ups, the per-deployment runs with their cache and
the report share one config and one result schema; the statistics are in `serving.correlation`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import time
from pathlib import Path

import numpy as np

from fp4rl import grouped
from fp4rl.recipe import PrecisionRecipe
from fp4rl.rl import data, verifier
from fp4rl.rl.sft import params_digest
from fp4rl.rl.task import TaskConfig, evaluate, make_problem
from fp4rl.serving import checkpoints, correlation, deployment
from fp4rl.serving.engine import Engine, EngineConfig, RowRequest

METRICS = ("greedy", "sampled", "multiturn_greedy", "multiturn_sampled")
SAMPLED = ("sampled", "multiturn_sampled")
RESULTS_FILE = "serve_eval.json"
FP8, NVFP4 = "mxfp8", "nvfp4_online"  # the headline pair


@dataclasses.dataclass(frozen=True)
class ServeEvalConfig:
    """checkpoint: the trained checkpoint (a warm-up run, an RL arm directory; `seed_index` for an
    arm's seed). deployments: "QUANTIZATION" or "QUANTIZATION:RECIPE" (`serving.deployment`); the
    first is the one the retest repeats. task: the difficulty levels (min_ops..max_ops, each its
    own level of `per_level` prompts). followup: the follow-up question's task (additions and
    subtractions only, so any fed-back integer gives a well-defined truth). engine: batch shapes
    (its max_new_tokens is every answer's budget). expert_gemm: the routed experts' grouped-GEMM
    backend ("": the checkpoint's; `checkpoints.with_expert_gemm`). bootstrap, ci: the intervals."""

    checkpoint: str = "runs/cpu/sft"
    seed_index: int = 0
    deployments: tuple[str, ...] = ("bf16", "mxfp8", "nvfp4_online")
    task: TaskConfig = TaskConfig(min_ops=1, max_ops=2, digits=1, max_operands=2)
    task_seed: int = 2_000_003
    per_level: int = 64
    samples: int = 4
    temperature: float = 1.0
    multi_turn: bool = True
    followup: TaskConfig = TaskConfig(min_ops=1, max_ops=1, digits=1, max_operands=2)
    retest: bool = True
    engine: EngineConfig = EngineConfig(max_batch=64, prompt_buckets=(32, 64), max_new_tokens=48)
    impl: str = "auto"
    expert_gemm: str = ""
    bootstrap: int = 2000
    ci: float = 0.95
    seed: int = 0
    out: str = "runs/cpu/serve_eval"

    def __post_init__(self):
        if not self.deployments or len(set(self.deployments)) != len(self.deployments):
            raise ValueError(f"deployments={self.deployments} must be non-empty and distinct")
        for spec in self.deployments:
            parse_deployment(spec)
        if self.expert_gemm:
            grouped.check_gemm(self.expert_gemm, auto=True)
        if self.per_level < 2 or self.samples < 1:
            raise ValueError(f"need per_level={self.per_level} >= 2 and samples={self.samples} >= 1")
        if not 0.0 < self.temperature <= 2.0:
            raise ValueError(f"temperature={self.temperature} must be in (0, 2] (greedy is scored separately)")
        f = self.followup
        if set(f.operators) - set("+-") or f.num_distractors or f.random_names:
            raise ValueError("followup must use + and - only, no distractors and names in order (a, b, ...): "
                             "then any fed-back integer gives a well-defined truth")


def parse_deployment(spec: str) -> tuple[str, str | None]:
    """"nvfp4_online" -> ("nvfp4_online", None); "nvfp4_online:nvfp4" -> ("nvfp4_online", "nvfp4")."""
    quantization, _, recipe = spec.partition(":")
    if quantization not in deployment.QUANTIZATIONS:
        raise ValueError(f"deployment {spec!r}: quantization must be one of {deployment.QUANTIZATIONS}")
    if recipe:
        PrecisionRecipe.from_name(recipe)
    return quantization, recipe or None


# ------------------------------------------------------------------ prompts and follow-ups
_STATEMENT = re.compile(r"([a-z])=([0-9a-z+\-*/%]+)\. ")
_TOKEN = re.compile(r"\d+|[a-z]|//|[-+*%]")


@dataclasses.dataclass(frozen=True)
class Followup:
    """A follow-up question whose given (its first binding) is the previous turn's answer."""

    given: str  # the variable that receives the fed-back answer
    steps: tuple[tuple[str, str], ...]  # (variable, expression) of the later bindings
    question: str

    @classmethod
    def from_problem(cls, prompt: str, answer: int) -> "Followup":
        statements = _STATEMENT.findall(prompt)
        question = _STATEMENT.sub("", prompt)
        followup = cls(statements[0][0], tuple(statements[1:]), question)
        literal = int(statements[0][1])
        if followup.prompt(literal) != prompt or followup.answer(literal) != answer:
            raise ValueError(f"cannot re-read the follow-up problem {prompt!r}")
        return followup

    def prompt(self, value: int) -> str:
        return " ".join([f"{self.given}={value}."] + [f"{v}={e}." for v, e in self.steps] + [self.question])

    def answer(self, value: int) -> int:
        values = {self.given: value}
        for var, expr in self.steps:
            tokens = _TOKEN.findall(expr)
            values[var] = evaluate([values[t] if t.isalpha() else int(t) for t in tokens[::2]], tokens[1::2])
        return values[self.steps[-1][0] if self.steps else self.given]


@dataclasses.dataclass(frozen=True)
class HeldOut:
    prompts: tuple[str, ...]
    answers: np.ndarray  # int64 [N]
    levels: np.ndarray  # int [N]: operations of each prompt
    followups: tuple[Followup, ...]


def held_out(config: ServeEvalConfig) -> HeldOut:
    prompts, answers, levels, followups = [], [], [], []
    for ops in range(config.task.min_ops, config.task.max_ops + 1):
        level = dataclasses.replace(config.task, min_ops=ops, max_ops=ops)
        for i in range(config.per_level):
            p = make_problem(i, config.task_seed, level)
            f = make_problem(len(prompts), config.task_seed + 1, config.followup)
            prompts.append(p.prompt)
            answers.append(p.answer)
            levels.append(ops)
            followups.append(Followup.from_problem(f.prompt, f.answer))
    return HeldOut(tuple(prompts), np.array(answers, np.int64), np.array(levels), tuple(followups))


def _row_seed(config: ServeEvalConfig, replicate: int, turn: int, prompt: int) -> int:
    return int(np.random.SeedSequence([config.seed, replicate, turn, prompt]).generate_state(1)[0])


# ------------------------------------------------------------------ one deployment
def _answer(text: str) -> int | None:
    boxed = verifier.extract_boxed(text)
    return None if boxed is None else verifier.parse_integer(boxed)


def _generate(engine: Engine, requests: list[tuple[str, int, int]], temperature: float) -> list[str]:
    """Texts of (prompt, seed, choice) requests at the engine's full token budget."""
    model, budget = engine.model, engine.config.max_new_tokens
    rows = [RowRequest(tuple(data.encode_prompt(p)), budget, temperature, 1.0, seed, choice)
            for p, seed, choice in requests]
    return [model.decode(r.token_ids) for r in engine.generate(rows)]


def score(engine: Engine, held: HeldOut, config: ServeEvalConfig, replicate: int, greedy: bool = True) -> dict:
    """Per-prompt scores {metric: [N]} of one deployment (replicate 0: the shared keys)."""
    N = len(held.prompts)
    seeds1 = [_row_seed(config, replicate, 1, i) for i in range(N)]
    seeds2 = [_row_seed(config, replicate, 2, i) for i in range(N)]
    modes = ([("greedy", 0.0, 1)] if greedy else []) + [("sampled", config.temperature, config.samples)]
    scores = {}
    for name, temperature, k in modes:
        requests = [(held.prompts[i], seeds1[i], j) for i in range(N) for j in range(k)]
        answers = [_answer(t) for t in _generate(engine, requests, temperature)]
        correct = np.array([a == held.answers[r // k] for r, a in enumerate(answers)], np.float64).reshape(N, k)
        scores[name] = correct.mean(axis=1)
        if not config.multi_turn:
            continue
        # Follow-ups of the first answers that hold an integer; the others fail without generating,
        # and so does one whose fed-back integer is too long for the largest prompt bucket.
        fed = [(r, held.followups[r // k].prompt(a)) for r, a in enumerate(answers) if a is not None]
        fed = [(r, p) for r, p in fed if len(data.encode_prompt(p)) <= engine.config.max_prompt_tokens]
        follow = [(p, seeds2[r // k], r % k) for r, p in fed]
        second = np.zeros(N * k)
        for (r, _), text in zip(fed, _generate(engine, follow, temperature)):
            second[r] = float(_answer(text) == held.followups[r // k].answer(int(held.answers[r // k])))
        scores[f"multiturn_{name}"] = second.reshape(N, k).mean(axis=1)
    return scores


def run_deployment(model: checkpoints.ServedModel, spec: str, held: HeldOut, config: ServeEvalConfig,
                   progress=print) -> tuple[dict, dict]:
    """(info, scores by replicate) of one deployment: quantize, compile, answer everything."""
    quantization, recipe = parse_deployment(spec)
    t0 = time.perf_counter()
    dep = deployment.quantize(model, quantization, recipe, config.impl)
    quantize_s = time.perf_counter() - t0
    engine = Engine(dep, config.engine)
    compile_s = engine.compile()
    progress(f"[{spec}] recipe {dep.recipe.name}: quantized in {quantize_s:.1f}s, compiled in {sum(compile_s.values()):.1f}s")
    scores = {0: score(engine, held, config, 0)}
    stats = dataclasses.replace(engine.stats)
    if config.retest and spec == config.deployments[0]:
        scores[1] = score(engine, held, config, 1, greedy=False)
    info = {"spec": spec, "quantization": quantization, "recipe": dep.recipe.name,
            "high_precision_layers": (dep.recipe.high_precision_summary(model.config.num_layers)
                                      if deployment.recipe_formats(dep.recipe) else "all (nothing quantized)"),
            "map4_frac": dep.map4_frac, "quantize_seconds": quantize_s, "compile_seconds": sum(compile_s.values()),
            "generate_seconds": stats.seconds, "generated_tokens": stats.tokens, "rows": stats.rows,
            "tokens_per_second": stats.tokens_per_second}
    progress(f"[{spec}] " + ", ".join(f"{m} {scores[0][m].mean():.3f}" for m in scores[0])
             + f"; {stats.tokens_per_second:.0f} tokens/s")
    return info, scores


# ------------------------------------------------------------------ statistics
RETEST_SUFFIX = " (retest)"


def analyse(scores: dict[str, dict[str, np.ndarray]], levels: np.ndarray, config: ServeEvalConfig) -> dict:
    """Accuracy per deployment (overall and per level) and correlations per pair, with CIs."""
    boot = dict(n_boot=config.bootstrap, ci=config.ci, seed=config.seed)
    accuracy = {name: {m: dataclasses.asdict(correlation.bootstrap_mean(s, **boot)) for m, s in by_metric.items()}
                for name, by_metric in scores.items()}
    by_level = {name: {m: {int(lv): float(s[levels == lv].mean()) for lv in np.unique(levels)}
                       for m, s in by_metric.items()} for name, by_metric in scores.items()}
    names = list(scores)
    pairs = []
    for a_i, a in enumerate(names):
        for b in names[a_i + 1:]:
            if RETEST_SUFFIX in a + b and b != a + RETEST_SUFFIX:
                continue  # a retest is compared with its own deployment only
            for metric in METRICS:
                if metric in scores[a] and metric in scores[b]:
                    pairs.append({"a": a, "b": b, "metric": metric, **{
                        method: dataclasses.asdict(correlation.bootstrap_correlation(
                            scores[a][metric], scores[b][metric], method, **boot))
                        for method in correlation.METHODS}})
    return {"accuracy": accuracy, "accuracy_by_level": by_level, "correlations": pairs}


def _interval(d: dict) -> correlation.Interval:
    return correlation.Interval(**d)


def headline(result: dict) -> str:
    """The seed's question in one sentence: do NVFP4 and FP8 deployment scores correlate?"""
    names = {d["quantization"]: d["spec"] for d in result["deployments"]}
    if FP8 not in names or NVFP4 not in names:
        return "The headline pair (nvfp4_online vs mxfp8) was not evaluated."
    nv, fp8 = names[NVFP4], names[FP8]
    lines = []
    for metric in SAMPLED:
        row = next((p for p in result["correlations"] if {p["a"], p["b"]} == {nv, fp8} and p["metric"] == metric), None)
        if row is not None:
            lines.append(f"{metric}: Pearson {_interval(row['pearson']).text()}, Spearman {_interval(row['spearman']).text()}")
    retest = next((p for p in result["correlations"] if p["b"].endswith(RETEST_SUFFIX) and p["metric"] == "sampled"), None)
    text = f"NVFP4 ({nv}) vs FP8 ({fp8}) per-prompt scores, {result['n_prompts']} prompts: " + "; ".join(lines) + "."
    if retest is not None:
        text += (f" Same deployment, independent sampling keys ({retest['a']} retest, sampled): Pearson "
                 f"{_interval(retest['pearson']).text()}.")
    return text


def markdown(result: dict) -> str:
    c = result["config"]
    lines = [f"# Deployment correlation: {result['checkpoint']}", "",
             f"{result['n_prompts']} held-out prompts ({c['per_level']} per level, operations "
             f"{c['task']['min_ops']}-{c['task']['max_ops']}, task seed {c['task_seed']}); sampled scores: "
             f"{c['samples']} samples at temperature {c['temperature']} per prompt; multi-turn: the first answer "
             "fed back as the follow-up's given. Every deployment draws sample j of prompt i with the same key, "
             "so their correlations measure what quantization changes; the retest repeats the first deployment "
             "with independent keys (the agreement sampling alone leaves). Intervals: "
             f"{int(100 * c['ci'])}% percentile bootstrap over prompts ({c['bootstrap']} replicates).", "",
             f"**{headline(result)}**", "", "## Deployments", "",
             "| deployment | recipe | BF16 layers | map-4 blocks | tokens/s | generated tokens | compile s |",
             "|---|---|---|---|---|---|---|"]
    for d in result["deployments"]:
        lines.append(f"| {d['spec']} | {d['recipe']} | {d['high_precision_layers']} | {d['map4_frac']:.3f} | "
                     f"{d['tokens_per_second']:.0f} | {d['generated_tokens']} | {d['compile_seconds']:.1f} |")
    metrics = [m for m in METRICS if any(m in acc for acc in result["accuracy"].values())]
    lines += ["", "## Accuracy", "", "| deployment | " + " | ".join(metrics) + " |", "|---|" + "---|" * len(metrics)]
    for name, acc in result["accuracy"].items():
        lines.append(f"| {name} | " + " | ".join(_interval(acc[m]).text() if m in acc else "-" for m in metrics) + " |")
    levels = sorted({lv for acc in result["accuracy_by_level"].values() for m in acc.values() for lv in m})
    lines += ["", "### By number of operations", "", "| deployment | metric | " + " | ".join(map(str, levels)) + " |",
              "|---|---|" + "---|" * len(levels)]
    for name, acc in result["accuracy_by_level"].items():
        for m, per in acc.items():
            lines.append(f"| {name} | {m} | " + " | ".join(f"{per[lv]:.3f}" for lv in levels) + " |")
    lines += ["", "## Correlation of per-prompt scores", "", "| a | b | metric | Pearson | Spearman | undefined replicates |",
              "|---|---|---|---|---|---|"]
    for p in result["correlations"]:
        undefined = max(p["pearson"]["undefined_frac"], p["spearman"]["undefined_frac"])
        lines.append(f"| {p['a']} | {p['b']} | {p['metric']} | {_interval(p['pearson']).text()} | "
                     f"{_interval(p['spearman']).text()} | {undefined:.1%} |")
    lines += ["", "![deployments](serve_eval.png)", ""]
    return "\n".join(lines)


def plot(result: dict, scores: dict[str, dict[str, np.ndarray]], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.8))
    names = list(result["accuracy"])
    metrics = [m for m in METRICS if m in result["accuracy"][names[0]]]
    width = 0.8 / len(names)
    ax = axes[0]
    for k, name in enumerate(names):
        acc = [result["accuracy"][name].get(m) for m in metrics]
        x = np.arange(len(metrics)) + (k - (len(names) - 1) / 2) * width
        values = np.array([a["value"] if a else np.nan for a in acc])
        err = np.array([[a["value"] - a["low"], a["high"] - a["value"]] if a else [np.nan, np.nan] for a in acc]).T
        ax.bar(x, values, width, yerr=err, capsize=2, label=name)
    ax.set_xticks(np.arange(len(metrics)), metrics, rotation=15)
    ax.set_ylabel("accuracy (per-prompt mean)")
    ax.set_title(f"accuracy, {int(100 * result['config']['ci'])}% CI over prompts")
    ax.legend(fontsize=7)

    ax = axes[1]
    specs = {d["quantization"]: d["spec"] for d in result["deployments"]}
    if FP8 in specs and NVFP4 in specs:
        x, y = scores[specs[FP8]]["sampled"], scores[specs[NVFP4]]["sampled"]
        pairs, counts = np.unique(np.stack([x, y], 1), axis=0, return_counts=True)
        ax.scatter(pairs[:, 0], pairs[:, 1], s=12 + 200 * counts / counts.max(), alpha=0.6)
        ax.plot([0, 1], [0, 1], color="grey", lw=0.8, ls="--")
        ax.set_xlabel(f"{specs[FP8]}: per-prompt sampled accuracy")
        ax.set_ylabel(f"{specs[NVFP4]}: per-prompt sampled accuracy")
        ax.set_title("per-prompt scores (marker area: prompts)")
    else:
        ax.set_axis_off()
        ax.text(0.5, 0.5, "nvfp4_online vs mxfp8 not evaluated", ha="center")

    ax = axes[2]
    rows = [p for p in result["correlations"] if p["metric"] in SAMPLED]
    drawn = set()
    for j, p in enumerate(rows):
        for off, method, marker in ((-0.15, "pearson", "o"), (0.15, "spearman", "s")):
            iv = p[method]
            if np.isnan(iv["value"]):
                continue
            low = iv["value"] - iv["low"] if not np.isnan(iv["low"]) else 0.0
            high = iv["high"] - iv["value"] if not np.isnan(iv["high"]) else 0.0
            ax.errorbar(iv["value"], j + off, xerr=[[low], [high]], fmt=marker, capsize=2,
                        color="C0" if method == "pearson" else "C1", label=None if method in drawn else method)
            drawn.add(method)
    ax.set_yticks(range(len(rows)), [f"{p['a']} vs {p['b']} ({p['metric']})" for p in rows], fontsize=6)
    ax.set_xlabel("correlation of per-prompt scores")
    ax.set_title("agreement between deployments")
    if drawn:
        ax.legend(fontsize=7)
    else:
        ax.text(0.5, 0.5, "every correlation undefined (constant scores)", ha="center", transform=ax.transAxes)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _jsonable(value):
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return _jsonable(value.tolist())
    if isinstance(value, float) and not np.isfinite(value):
        return None  # JSON has no NaN: an undefined statistic reads back as null
    if isinstance(value, (np.floating, np.integer)):
        return _jsonable(value.item())
    return value


def _cache_key(config: ServeEvalConfig, spec: str, params_sha256: str) -> str:
    """What a deployment's scores depend on: the checkpoint's bytes and every setting but the
    statistics and the other deployments."""
    settings = {k: v for k, v in dataclasses.asdict(config).items() if k not in ("deployments", "bootstrap", "ci", "out")}
    if not config.expert_gemm:  # the checkpoint's backend: the key of results saved before the option
        settings.pop("expert_gemm")
    settings.update(spec=spec, retest=config.retest and spec == config.deployments[0], params_sha256=params_sha256)
    return hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()


def _cached_deployment(model, spec: str, held: HeldOut, config: ServeEvalConfig, progress) -> tuple[dict, dict]:
    """`run_deployment`, or its saved result under <out>/deployments/ when made with the same key,
    so that an interrupted evaluation resumes at the first deployment it had not finished."""
    path = Path(config.out) / "deployments" / (re.sub(r"[^A-Za-z0-9_.+-]", "_", spec) + ".json")
    key = _cache_key(config, spec, params_digest(model.params))
    if path.exists():
        saved = json.loads(path.read_text())
        if saved["key"] == key:
            progress(f"[{spec}] reusing {path}")
            return saved["info"], {int(r): {m: np.array(v) for m, v in s.items()} for r, s in saved["scores"].items()}
    info, scores = run_deployment(model, spec, held, config, progress)
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {"key": key, "info": info, "scores": {r: {m: v.tolist() for m, v in s.items()} for r, s in scores.items()}}
    path.write_text(json.dumps(_jsonable(record)))
    return info, scores


def run(config: ServeEvalConfig, progress=print) -> dict:
    """Evaluate every deployment and write the JSON, the markdown report and the plot."""
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    model = checkpoints.load(config.checkpoint, config.seed_index, config.expert_gemm)
    if not model.text:
        raise ValueError(f"{config.checkpoint} has no text tokenizer; the RL task needs a project checkpoint")
    held = held_out(config)
    deployments, scores = [], {}
    for spec in config.deployments:
        info, by_replicate = _cached_deployment(model, spec, held, config, progress)
        deployments.append(info)
        scores[spec] = by_replicate[0]
        if 1 in by_replicate:
            scores[spec + RETEST_SUFFIX] = by_replicate[1]
    result = {"checkpoint": model.path, "trained_recipe": model.trained_recipe, "n_prompts": len(held.prompts),
              "config": json.loads(json.dumps(dataclasses.asdict(config), default=str)), "deployments": deployments,
              **analyse(scores, held.levels, config),
              "scores": {name: {m: s.tolist() for m, s in by_metric.items()} for name, by_metric in scores.items()},
              "levels": held.levels.tolist(), "seconds": time.time() - t0}
    result["headline"] = headline(result)
    (out / RESULTS_FILE).write_text(json.dumps(_jsonable(result), indent=1))
    (out / "report.md").write_text(markdown(result))
    plot(result, scores, out / "serve_eval.png")
    return result
