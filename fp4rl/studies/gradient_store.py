"""What a gradient measurement keeps on disk so that it can be split over several processes.

A device call is limited in time, and the H200 measurement of every recipe takes longer than one
call. So the rollout batches are drawn once and stored (`save_rollouts` / `load_rollouts`, keyed
by the warm-up's parameter hash and the rollout settings), each call measures a subset of the
recipes on exactly those batches, and `merge` combines the calls' raw arrays into one, which
`fp4rl.analysis.gradient_report.analyze` reads as if one process had measured everything.

Every statistic is per gradient source over the shared batches (a source is only ever compared
with BF16 and with its own straight-through view, both measured in the same call), so merging is
a union; what must agree is checked: the batches (their SHA-256), the warm-up, the settings, and
the BF16 reference measured in every part (its per-batch norms within `REFERENCE_DRIFT_MAX`; the
largest relative drift is reported as `reference_drift`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

RAW_ARRAYS = ("per_batch", "gram_diff", "gram_ref", "kl")  # nested dicts of arrays -> raw.npz
RAW_FILE, RAW_META_FILE = "gradients.npz", "raw.json"
# Settings every part must share (the rest may differ, e.g. the recipes or the compile workers).
# The reference is measured again in every part. XLA:GPU's atomics (scatter-adds in the backward)
# reorder BF16 sums between processes, which moves a per-batch norm by up to a few BF16 ulps
# (2^-8 = 3.9e-3 relative); deterministic ops would cost ~3.5x the time. A larger drift means other
# parameters or batches. Far below the decision's thresholds (5% of the noise, 0.1 of the signal).
REFERENCE_DRIFT_MAX = 1e-2
SHARED_SETTINGS = ("rollout", "batches", "sr_keys", "optim", "impl", "sketch_dim", "kl_batches", "adam_warmup_batches",
                   "seed")
# A setting added after measurements were stored: what those measurements ran with.
SETTING_DEFAULTS = {"adam_warmup_batches": 0}


# ---------------------------------------------------------------------------------- rollouts
def rollouts_digest(batches: Sequence[Mapping[str, np.ndarray]]) -> str:
    """SHA-256 over every array of every batch (names, dtypes, shapes and bytes)."""
    digest = hashlib.sha256()
    for batch in batches:
        for name in sorted(batch):
            a = np.ascontiguousarray(batch[name])
            digest.update(f"{name}:{a.dtype.str}:{a.shape}".encode())
            digest.update(a.tobytes())
    return digest.hexdigest()


def rollout_key(config, warmup_sha256: str) -> dict:
    """What the batches depend on: the warm-up, the rollout settings, their number and the seed."""
    return {"warmup_sha256": warmup_sha256, "rollout": json.loads(json.dumps(dataclasses.asdict(config.rollout), default=str)),
            "batches": config.batches, "seed": config.seed}


def save_rollouts(path: str | Path, batches: list[dict], stats: dict, key: dict) -> str:
    """Write the batches and their stats to `path` (.npz); returns their digest."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    arrays = {f"{b}/{name}": v for b, batch in enumerate(batches) for name, v in batch.items()}
    digest = rollouts_digest(batches)
    meta = {"key": key, "stats": stats, "sha256": digest, "batches": len(batches)}
    tmp = path.with_name(path.name + ".tmp.npz")
    np.savez_compressed(tmp, __meta__=np.frombuffer(json.dumps(meta).encode(), np.uint8), **arrays)
    tmp.replace(path)  # atomic: a call cut short leaves no half-written file
    return digest


def load_rollouts(path: str | Path, key: dict) -> tuple[list[dict], dict, str]:
    """(batches, stats, digest) stored by `save_rollouts` under the same `key`; a different key
    (another warm-up or other settings) or corrupted arrays are an error naming the difference."""
    with np.load(path) as f:
        meta = json.loads(f["__meta__"].tobytes().decode())
        if meta["key"] != key:
            diff = sorted(k for k in set(key) | set(meta["key"]) if key.get(k) != meta["key"].get(k))
            raise ValueError(f"{path}: the stored rollouts were drawn with other {diff} "
                             f"(stored {[meta['key'].get(k) for k in diff]}, this run {[key.get(k) for k in diff]}); "
                             "delete the file or point --rollouts_file elsewhere")
        batches = [{} for _ in range(meta["batches"])]
        for name in f.files:
            if name != "__meta__":
                b, field = name.split("/", 1)
                batches[int(b)][field] = f[name]
    digest = rollouts_digest(batches)
    if digest != meta["sha256"]:
        raise ValueError(f"{path}: the arrays' SHA-256 {digest} differs from the stored {meta['sha256']} (corrupted file)")
    return batches, meta["stats"], digest


# ---------------------------------------------------------------------------------- raw arrays
def _flat(tree: Mapping, prefix: str = "") -> dict[str, np.ndarray]:
    out = {}
    for k, v in tree.items():
        if isinstance(v, Mapping):
            out.update(_flat(v, f"{prefix}{k}/"))
        else:
            out[f"{prefix}{k}"] = np.asarray(v)
    return out


def _nest(flat: Mapping[str, np.ndarray]) -> dict:
    out: dict = {}
    for name, v in flat.items():
        *path, leaf = name.split("/")
        node = out
        for k in path:
            node = node.setdefault(k, {})
        node[leaf] = v
    return out


def _jsonable(x):
    if isinstance(x, Mapping):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, np.ndarray):
        return {"__array__": x.tolist(), "dtype": x.dtype.str}
    if isinstance(x, np.generic):
        return x.item()
    return x


def _from_json(x):
    if isinstance(x, dict):
        if "__array__" in x:
            return np.asarray(x["__array__"], x["dtype"])
        return {k: _from_json(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_from_json(v) for v in x]
    return x


def save_raw(raw: Mapping, settings: Mapping, out: str | Path) -> None:
    """The raw arrays (`RAW_FILE`) and everything else of `raw` plus the run's settings (`RAW_META_FILE`)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(out / RAW_FILE, **_flat({k: raw[k] for k in RAW_ARRAYS}))
    meta = {k: v for k, v in raw.items() if k not in RAW_ARRAYS}
    (out / RAW_META_FILE).write_text(json.dumps(_jsonable({"raw": meta, "settings": settings}), indent=1))


def load_meta(out: str | Path) -> tuple[dict, dict]:
    """(raw without its arrays `RAW_ARRAYS`, settings): `RAW_META_FILE` alone, as `save_raw` wrote it under
    `out` (the committed parts keep it in the tree; their arrays come back with tools/data_files.py)."""
    path = Path(out) / RAW_META_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: is {out} the --out of a gradient measurement?")
    meta = _from_json(json.loads(path.read_text()))
    return meta["raw"], meta["settings"]


def load_raw(out: str | Path) -> tuple[dict, dict]:
    """(raw, settings) as `save_raw` wrote them under `out`."""
    out = Path(out)
    for name in (RAW_FILE, RAW_META_FILE):
        if not (out / name).is_file():
            raise FileNotFoundError(f"{out / name} is missing: is {out} the --out of a gradient measurement? "
                                    "(committed results: `python tools/data_files.py fetch` brings their arrays back)")
    meta, settings = load_meta(out)
    with np.load(out / RAW_FILE) as f:
        arrays = _nest({name: f[name] for name in f.files})
    return {**meta, **{k: arrays.get(k, {}) for k in RAW_ARRAYS}}, settings


def merge(parts: Sequence[tuple[dict, dict]]) -> tuple[dict, dict]:
    """One raw dict from several (raw, settings) parts measured on the same batches; raises a
    ValueError naming the first disagreement (batches, settings, or the BF16 reference)."""
    if not parts:
        raise ValueError("nothing to merge: name at least one measurement directory")
    raw0, settings0 = parts[0]
    merged = {k: (dict(v) if isinstance(v, dict) else v) for k, v in raw0.items()}
    merged["recipes"], merged["sources"] = list(raw0["recipes"]), list(raw0["sources"])
    drifts = []  # per later part: the reference's relative per-batch norm differences from part 0's
    for i, (raw, settings) in enumerate(parts[1:], 1):
        for name in ("rollouts_sha256", "warmup_sha256"):
            if raw.get(name) != raw0.get(name):
                raise ValueError(f"part {i}: {name} {raw.get(name)} != part 0's {raw0.get(name)}: not the same batches")
        for name in SHARED_SETTINGS:
            value, value0 = (s.get(name, SETTING_DEFAULTS.get(name)) for s in (settings, settings0))
            if value != value0:
                raise ValueError(f"part {i}: setting {name}={value} != part 0's {value0}")
        ref = raw0["reference"]
        ref_sq, ref_sq0 = (r["per_batch"][ref]["cmp"]["bf16"]["ref_sq"] for r in (raw, raw0))
        rel = np.abs(np.sqrt(ref_sq) - np.sqrt(ref_sq0)) / np.maximum(np.sqrt(ref_sq0), 1e-30)
        drift = float(np.max(rel))
        if not drift <= REFERENCE_DRIFT_MAX:
            raise ValueError(f"part {i}: the {ref} reference's gradient norms differ from part 0's by up to {drift:.3g} "
                             f"(relative; allowed {REFERENCE_DRIFT_MAX:g}): not the same parameters or batches")
        drifts.append(rel)
        for src in raw["sources"]:
            if src in merged["sources"]:
                continue  # measured again: the reference (within the drift above) or a shared straight-through view
            merged["sources"].append(src)
            for k in ("per_batch", "gram_diff", "refs_of", "sr_keys"):
                merged[k][src] = raw[k][src]
        for src, gram in raw["gram_ref"].items():
            merged["gram_ref"].setdefault(src, gram)
        for name in raw["recipes"]:
            if name == ref:
                continue  # every part measures it; part 0's is kept (the drift above is reported)
            if name in merged["recipes"]:
                raise ValueError(f"recipe {name!r} is measured in part {i} and an earlier part: merge each recipe once")
            merged["recipes"].append(name)
            merged["kl"][name] = raw["kl"][name]
            merged["forward_class"][name] = raw["forward_class"][name]
        for cls, variants in raw["mismatch"].items():
            merged["mismatch"].setdefault(cls, variants)
        merged["sketched_groups"] = sorted(set(merged["sketched_groups"]) | set(raw["sketched_groups"]))
    if drifts:
        merged["reference_drift"] = {"max": max(float(np.max(r)) for r in drifts),
                                     "median": max(float(np.median(r)) for r in drifts)}
    return merged, settings0
