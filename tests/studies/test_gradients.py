"""Fixed-parameter gradient measurements end to end on the smoke preset and a tiny warm-up.

The smoke warm-up is trained once (module fixture) and the smoke measurement run once; the
exactness checks then reuse its compiled programs (same process, persistent compilation cache).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from experiments import gradients as gradients_experiment
from fp4rl import configs
from fp4rl.analysis import gradient_report, scaling
from fp4rl.recipe import PrecisionRecipe
from fp4rl.rl import sft

from fp4rl.studies import gradient_store, gradients

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smoke(warmup_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("gradients")
    config = dataclasses.replace(configs.GRADIENTS_PRESETS["smoke"], init=str(warmup_dir), out=str(out / "run"),
                                 rollouts_file=str(out / "rollouts.npz"))
    return config, gradients.run(config, progress=False)


def _with_signal(batches):
    """The batches with every response token in the loss and advantages +1/-1 by row: the smoke
    warm-up solves nothing, so dynamic sampling masks every group and only the load-balancing
    term would reach the gradient."""
    out = []
    for b in batches:
        response = b["valid"][:, -b["response_mask"].shape[1]:]
        advantages = np.where(np.arange(len(response)) % 2, -1.0, 1.0).astype(np.float32)
        out.append({**b, "response_mask": response, "advantages": advantages})
    return out


def test_smoke_writes_json_report_and_plots(smoke):
    config, results = smoke
    out = Path(config.out)
    for name in ("gradients.json", "gradients.npz", "raw.json", "report.md", "gradient_error.png", "grad_norms.png",
                 "policy_change.png", "batch_scaling.png", gradient_report.SCALING_POINT_FILE):
        assert (out / name).stat().st_size > 0, name
    point = scaling.load_point(out)  # one rung of the fit over model sizes
    assert scaling.rung_summary(point)["num_layers"] == 2 and point["batches"] == config.batches
    assert set(point["recipes"]) == set(config.recipe_names)
    assert len(point["recipes"]["nvfp4"]["all"]["b2"]["replicates"]) == min(config.bootstrap, gradient_report.SCALING_REPLICATES)
    saved = json.loads((out / "gradients.json").read_text())
    assert set(saved["recipes"]) == set(config.recipe_names)
    assert saved["decision"]["rule"] == gradient_report.DECISION_RULE
    assert saved["decision"]["outcome"] in ("operates", "does not operate", "undecided")
    for name, entry in saved["recipes"].items():
        assert len(entry["grad_norm"]["values"]) == config.batches
        assert set(entry["policy_change_kl"]) == {f"{lr:g}" for lr in config.optim.lrs}
        groups = set(gradients.GROUPS) | set(gradient_report.DERIVED_GROUPS)  # the measured groups and all_but_shared
        assert set(entry["vs_bf16"]) == groups == set(entry["vs_ste"]) == set(saved["groups"])
        for group in groups:
            c = entry["vs_bf16"][group]["rel_error"]
            assert c["lo"] <= c["value"] <= c["hi"], (name, group, c)
    # sampler/trainer variants: measured on CPU for the reference impl, marked n/a for Triton
    assert saved["recipes"]["nvfp4"]["mismatch_k3"]["float32/reference"]["value"] >= 0
    report = (out / "report.md").read_text()
    assert report.index("## Decision rule") < report.index("## Gradient error") < report.index("## Decision\n")
    assert saved["decision"]["conclusion"] in report


def test_bf16_against_itself_is_exact(smoke):
    _, results = smoke
    bf16 = results["recipes"]["bf16"]
    for group in gradients.GROUPS:
        for ref in ("vs_bf16", "vs_ste"):
            assert bf16[ref][group]["rel_error"] == {"value": 0.0, "lo": 0.0, "hi": 0.0}
            assert bf16[ref][group]["cosine"]["value"] == 1.0
            assert bf16[ref][group]["bias"]["value"] == 0.0
    assert bf16["grad_norm"]["fisher_p_vs_bf16"] == 1.0


def test_straight_through_backward_equals_its_reference_exactly(smoke, warmup_dir):
    """nvfp4 (BF16 backward) is its own straight-through gradient, measured once, and the
    reference of nvfp4-pt (the same forward, the pretraining recipe's quantized backward)."""
    config, _ = smoke
    nvfp4, pt = PrecisionRecipe.from_name("nvfp4"), PrecisionRecipe.from_name("nvfp4-pt")
    assert gradients.straight_through(pt) == gradients.straight_through(nvfp4) != nvfp4
    assert gradients.is_straight_through(nvfp4) and not gradients.is_straight_through(pt)
    session = gradients.Session(dataclasses.replace(config, batches=2), {"nvfp4-pt": pt, "nvfp4": nvfp4},
                                sft.load(warmup_dir), progress=False)
    assert list(session.sources.values()) == ["bf16", "nvfp4", "nvfp4-pt"]  # no separate straight-through program
    assert session.refs_of["nvfp4-pt"]["ste"] == session.refs_of["nvfp4"]["ste"] == "nvfp4"
    with pytest.raises(ValueError, match="measure each gradient once"):
        gradients.Session(config, {"nvfp4": nvfp4, "copy": dataclasses.replace(nvfp4, name="copy")},
                          sft.load(warmup_dir), progress=False)
    batches, _ = session.draw_rollouts()
    raw = session.gradients(_with_signal(batches))
    session.programs.close()
    assert raw["sr_keys"] == {"bf16": 1, "nvfp4": 1, "nvfp4-pt": config.sr_keys}
    own = raw["per_batch"]["nvfp4"]["cmp"]["ste"]  # nvfp4 against itself: exactly 0, no division by 0 below
    assert np.all(own["ref_sq"] > 0)
    np.testing.assert_array_equal(own["err_sq"], 0.0)
    np.testing.assert_array_equal(own["dot0"], own["ref_sq"])
    differs = raw["per_batch"]["nvfp4-pt"]["cmp"]["ste"]
    routed = gradients.GROUPS.index("routed_experts")
    assert np.all(differs["err_sq"][:, routed] > 0)  # the quantized backward differs from straight-through
    assert np.all(raw["per_batch"]["nvfp4-pt"]["sr_var"][:, routed] > 0)  # and varies with the SR key
    np.testing.assert_array_equal(raw["per_batch"]["nvfp4"]["sr_var"], 0.0)  # one key: no SR variance
    np.testing.assert_array_equal(raw["per_batch"]["bf16"]["cmp"]["bf16"]["err_sq"], 0.0)
    kl = raw["kl"]["nvfp4-pt"]  # [batches, lrs]
    assert np.all(kl[:, 0] > 0) and np.all(kl[:, -1] > kl[:, 0])  # a larger step moves the policy more
    np.testing.assert_array_equal(raw["per_batch"]["nvfp4-pt"]["ratio_dev"], 0.0)  # on-policy: ratio exactly 1
    raw.update(rollouts={"accuracy": [0.0, 0.0], "loss_tokens": [1, 1]}, mismatch={})
    stats = gradient_report.analyze(raw, 50)["recipes"]["nvfp4"]["vs_ste"]
    for group in gradients.GROUPS:
        assert stats[group]["rel_error"] == {"value": 0.0, "lo": 0.0, "hi": 0.0}, group


def test_policy_change_from_a_warmed_adamw_state(smoke, warmup_dir):
    """adam_warmup_batches=1: each recipe's AdamW moments take its gradient of batch 0, the policy
    change is measured on batches 1 and 2 from that state (recomputed here step by step), and it
    differs from a fresh state's update (about -lr * sign(g))."""
    import jax
    import jax.numpy as jnp

    from fp4rl.rl import dapo, policy

    config = dataclasses.replace(smoke[0], adam_warmup_batches=1, kl_batches=2)
    nvfp4 = PrecisionRecipe.from_name("nvfp4")
    session = gradients.Session(config, {"bf16": PrecisionRecipe.from_name("bf16"), "nvfp4": nvfp4},
                                sft.load(warmup_dir), progress=False)
    batches = _with_signal(session.draw_rollouts()[0])
    raw = session.gradients(batches)
    assert raw["kl_batches_range"] == [1, 3] and raw["kl"]["nvfp4"].shape == (2, len(config.optim.lrs))
    p, params, dtype = session.programs, session.params, session.model_config.dtype

    def grad_and_kl_inputs(b):
        a = batches[b]
        tokens, valid, rmask = (jnp.asarray(a[k]) for k in ("tokens", "valid", "response_mask"))
        old = p(session.logp(nvfp4.forward_only(), dtype, session.impl), params, tokens, valid)
        batch = policy.Batch(tokens, valid, rmask, old, jnp.asarray(a["logp_sampler"]), old, jnp.asarray(a["advantages"]))
        keys = jax.random.split(gradients._key(session.root, gradients.SR_STREAM, b), config.sr_keys)[:1]
        source = next(r for r, name in session.sources.items() if name == "nvfp4")  # its straight-through view
        return p(session.gradient(source), params, batch, keys)["g0"], tokens, valid, rmask, old

    g0, *_ = grad_and_kl_inputs(0)
    state = p("adam warm", params, p("adam init", params), g0)
    g1, tokens, valid, rmask, old = grad_and_kl_inputs(1)
    lr = jnp.float32(config.optim.lrs[-1])

    def kl_of(new_params):
        new = p(session.logp(nvfp4.forward_only(), dtype, session.impl), new_params, tokens, valid)
        return float(dapo.masked_mean(dapo.kl_k3(old, new), rmask))

    assert kl_of(p("warm step", params, state, g1, lr)) == raw["kl"]["nvfp4"][0, -1]
    assert not np.isclose(kl_of(p("step", params, g1, lr)), raw["kl"]["nvfp4"][0, -1], rtol=1e-2)
    session.programs.close()
    with pytest.raises(ValueError, match="batches - 2"):
        dataclasses.replace(config, adam_warmup_batches=config.batches - 1)
    with pytest.raises(ValueError, match="batches - adam_warmup_batches"):
        dataclasses.replace(config, adam_warmup_batches=1, kl_batches=config.batches)


def _part(raw: dict, recipes: list[str]) -> dict:
    """The measurement of `recipes` alone (plus the reference and their straight-through views)."""
    sources = [s for s in raw["sources"] if s in recipes or s == raw["reference"]
               or any(raw["refs_of"][r].get("ste") == s for r in recipes)]
    keep = lambda d, names: {k: v for k, v in d.items() if k in names}  # noqa: E731
    part = {**raw, "recipes": [raw["reference"], *recipes], "sources": sources,
            "gram_ref": keep(raw["gram_ref"], sources)}
    for k in ("per_batch", "gram_diff", "refs_of", "sr_keys"):
        part[k] = keep(raw[k], sources)
    for k in ("kl", "forward_class"):
        part[k] = keep(raw[k], part["recipes"])
    part["mismatch"] = keep(raw["mismatch"], {raw["forward_class"][r] for r in part["recipes"]})
    return part


def test_parts_merged_equal_one_measurement(smoke, tmp_path):
    """The H200 measurement is split over device calls: recipes measured in separate processes on the
    stored rollouts and merged give the statistics of one process measuring them all."""
    config, results = smoke
    raw, settings = gradient_store.load_raw(config.out)
    assert gradient_report.analyze(raw, config.bootstrap, config.seed)["recipes"] == results["recipes"]  # lossless
    meta, meta_settings = gradient_store.load_meta(config.out)  # raw.json alone: everything but the arrays
    assert meta_settings == settings and set(meta) == set(raw) - set(gradient_store.RAW_ARRAYS)
    dirs = []
    for i, recipes in enumerate([[], ["nvfp4"]]):
        dirs.append(str(tmp_path / f"part{i}"))
        gradient_store.save_raw(_part(raw, recipes), settings, dirs[-1])
    merged = gradients.run(dataclasses.replace(config, merge=tuple(dirs), out=str(tmp_path / "merged")), progress=False)
    as_json = lambda x: json.loads(json.dumps(gradient_report._jsonable(x)))  # noqa: E731
    for key in ("recipes", "straight_through", "noise_floor", "rollouts", "decision"):
        assert as_json(merged[key]) == as_json(results[key]), key
    assert "Merged from 2 measurements" in (tmp_path / "merged" / "report.md").read_text()
    assert not (tmp_path / "merged" / gradient_store.RAW_FILE).exists()  # the parts keep the raw arrays
    with pytest.raises(ValueError, match="measured in part 1 and an earlier part"):
        gradient_store.merge([(raw, settings), (raw, settings)])
    with pytest.raises(ValueError, match="rollouts_sha256"):
        gradient_store.merge([(raw, settings), ({**_part(raw, []), "rollouts_sha256": "0" * 64}, settings)])
    with pytest.raises(ValueError, match="setting batches"):
        gradient_store.merge([(raw, settings), (_part(raw, []), {**settings, "batches": 99})])
    # a part stored before adam_warmup_batches existed ran with a fresh AdamW state: it merges with 0
    older = {k: v for k, v in settings.items() if k != "adam_warmup_batches"}
    gradient_store.merge([(_part(raw, ["nvfp4"]), settings), (_part(raw, []), older)])
    with pytest.raises(ValueError, match="setting adam_warmup_batches"):
        gradient_store.merge([(_part(raw, ["nvfp4"]), settings), (_part(raw, []), {**settings, "adam_warmup_batches": 1})])
    def reference_scaled(factor):  # BF16's per-batch squared norms as another process might give them
        part = _part(raw, [])
        bf16 = raw["per_batch"]["bf16"]
        cmp = {**bf16["cmp"], "bf16": {**bf16["cmp"]["bf16"], "ref_sq": bf16["cmp"]["bf16"]["ref_sq"] * factor**2}}
        part["per_batch"] = {**part["per_batch"], "bf16": {**bf16, "cmp": cmp}}
        return part, settings

    drifted, _ = gradient_store.merge([(_part(raw, ["nvfp4"]), settings), reference_scaled(1 + 1e-4)])
    assert drifted["reference_drift"]["max"] == pytest.approx(1e-4, rel=1e-2)  # reported, within the allowance
    with pytest.raises(ValueError, match="not the same parameters or batches"):
        gradient_store.merge([(_part(raw, ["nvfp4"]), settings), reference_scaled(1.1)])


def test_rollouts_file_is_reused_and_checked(smoke, tmp_path):
    config, results = smoke
    key = gradient_store.rollout_key(config, results["warmup_sha256"])
    batches, stats, digest = gradient_store.load_rollouts(config.rollouts_file, key)
    assert digest == results["rollouts_sha256"] and len(batches) == config.batches
    assert len(stats["accuracy"]) == len(stats["loss_tokens"]) == config.batches
    with pytest.raises(ValueError, match=r"other \['seed'\]"):
        gradient_store.load_rollouts(config.rollouts_file, {**key, "seed": 1})
    copy = tmp_path / "rollouts.npz"
    gradient_store.save_rollouts(copy, [{**b, "advantages": b["advantages"] + 1} if i == 0 else b
                                        for i, b in enumerate(batches)], stats, key)
    assert gradient_store.load_rollouts(copy, key)[2] != digest  # the digest covers every array
    with np.load(copy) as f:
        arrays = dict(f)
    arrays["0/advantages"] = arrays["0/advantages"] - 1
    np.savez(copy, **arrays)  # the arrays changed behind the stored digest
    with pytest.raises(ValueError, match="corrupted"):
        gradient_store.load_rollouts(copy, key)


def test_draws_keys_and_straight_through_views():
    assert gradients.draws_keys(PrecisionRecipe.from_name("nvfp4-pt"))
    for name in ("nvfp4", "+dq", "+46", "full-dq", "mxfp8", "mxfp8+dq"):  # BF16 or dequantized backward
        assert not gradients.draws_keys(PrecisionRecipe.from_name(name)), name
    assert not gradients.draws_keys(PrecisionRecipe.from_name("mxfp8-q"))  # MXFP8 re-quantizes deterministically
    own = {n for n in PrecisionRecipe.names() if gradients.is_straight_through(PrecisionRecipe.from_name(n))}
    assert own == {"bf16", "nvfp4", "+46", "+hp", "full-dq", "mxfp8", "nvfp4+attn", "nvfp4-tensor",
                   "nvfp4@4", "nvfp4@16", "nvfp4@64"}  # the BF16-backward arms
    bf16 = PrecisionRecipe.from_name("bf16")
    assert gradients.straight_through(bf16) is bf16
    views = {gradients.straight_through(PrecisionRecipe.from_name(n)) for n in ("nvfp4", "+dq", "full", "full-dq")}
    assert len(views) == 2  # arms differing only in their backward share a straight-through view


def test_cli_help_lists_presets(capsys):
    with pytest.raises(SystemExit) as e:
        gradients_experiment.main(["--help"])
    assert e.value.code == 0
    assert "smoke, cpu, h200" in capsys.readouterr().out
