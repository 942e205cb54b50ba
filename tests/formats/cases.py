"""Reusable inputs and config combinations for the NVFP4 / MX test suite.

Kernel test files import these so that every implementation is pinned on the same inputs
(docs/design.md practice 2). All generators are deterministic (fixed seeds) and return float32.

Every case is a [ROWS, COLS] = [32, 64] matrix, so that 1x16 and 16x16 blocks both apply,
and families stack CASES_PER_FAMILY such matrices: [C, 32, 64]. One jit(vmap(quantize))
compile per config then serves every family (each case gets its own per-tensor amax).
"""

from __future__ import annotations

import itertools

import ml_dtypes
import numpy as np

ROWS, COLS = 32, 64
CASES_PER_FAMILY = 8

# ------------------------------------------------------------------------------------------
# Config combinations (NVFP4Config fields, docs/INTERFACES.md)

CONFIG_AXES = {
    "block_2d": (False, True),
    "scale": ("tensor", "token"),
    "four_over_six": (None, "mae", "mse"),
    "e4m3_max": (None, 256, 448),
    "fast_error": (False, True),
}


def all_config_kwargs():
    """Every combination of the config axes (72), valid or not."""
    keys = list(CONFIG_AXES)
    return [dict(zip(keys, vals)) for vals in itertools.product(*CONFIG_AXES.values())]


def invalid_reason(kw) -> str | None:
    """Why a combination is invalid, or None. The two rules:

    - block_2d with per-token scale: a 16x16 tile spans 16 rows and shares one scale
      (docs/numerics.md §2), which a per-row amax cannot give.
    - fast_error without Four-Over-Six: the flag would be silently ignored (docs/design.md refuses
      silently ignored parameters).
    """
    if kw["block_2d"] and kw["scale"] == "token":
        return "block_2d needs scale='tensor'"
    if kw["fast_error"] and kw["four_over_six"] is None:
        return "fast_error needs four_over_six"
    return None


def config_id(kw) -> str:
    return "-".join(
        [
            "2d" if kw["block_2d"] else "1d",
            kw["scale"],
            kw["four_over_six"] or "map6",
            f"E{kw['e4m3_max']}" if kw["e4m3_max"] else "Edef",
            "fast" if kw["fast_error"] else "exact",
        ]
    )


def valid_config_kwargs():
    return [kw for kw in all_config_kwargs() if invalid_reason(kw) is None]


def invalid_config_kwargs():
    return [kw for kw in all_config_kwargs() if invalid_reason(kw) is not None]


# ------------------------------------------------------------------------------------------
# Random families

def _rng(name: str) -> np.random.Generator:
    return np.random.default_rng(sum(map(ord, name)) * 7919)  # stable across runs (no hash())


def _shape():
    return (CASES_PER_FAMILY, ROWS, COLS)


def normal():
    return _rng("normal").standard_normal(_shape()).astype(np.float32)


def student_t():
    """Heavy tails (df=2: infinite variance), so block maxima span many binades."""
    return _rng("student_t").standard_t(2, _shape()).astype(np.float32)


def tiny():
    """Normal at 1e-6: scales far below 1 but no float32 subnormal anywhere (XLA on CPU
    flushes float32 subnormals to zero, which the contract's IEEE fl(.) does not)."""
    return (_rng("tiny").standard_normal(_shape()) * 1e-6).astype(np.float32)


def huge():
    """Normal at 1e30: products with dec*sf reach ~1e33; MSE errors overflow to Inf."""
    return (_rng("huge").standard_normal(_shape()) * 1e30).astype(np.float32)


def zeros():
    return np.zeros(_shape(), np.float32)


def mixed_zero_blocks():
    """About a third of the 16-element blocks (and some whole 16x16 tiles) are exactly zero."""
    r = _rng("mixed_zero_blocks")
    x = r.standard_t(3, _shape()).astype(np.float32)
    blocks = x.reshape(CASES_PER_FAMILY, ROWS, COLS // 16, 16)
    blocks[r.random(blocks.shape[:3]) < 0.33] = 0.0
    x[:, 16:32, 0:16] = 0.0  # one whole 2D tile per case
    x[3] = 0.0  # one all-zero case among non-zero ones
    return x


def uniform():
    return _rng("uniform").uniform(-1, 1, _shape()).astype(np.float32)


def llm_activations(shape=None, seed_name="llm"):
    """LLM-like activations: normal tokens, a few outlier channels (x30-x100), and a few
    tokens with a larger overall scale (attention-sink-like)."""
    shape = _shape() if shape is None else shape
    r = _rng(seed_name)
    x = r.standard_normal(shape)
    k = shape[-1]
    n_out = max(1, k // 64)
    chans = r.choice(k, n_out, replace=False)
    x[..., chans] *= r.uniform(30, 100, n_out)
    tok = x.reshape(-1, k)
    sinks = r.random(tok.shape[0]) < 0.02
    tok[sinks] *= 20
    return tok.reshape(shape).astype(np.float32)


# ------------------------------------------------------------------------------------------
# Tie families: S_enc = 1 exactly, so the scaled domain is the input domain

def _neighbours(v, n=2):
    """v and its n float32 neighbours on each side (np.nextafter)."""
    v = np.float32(v)
    out = [v]
    up = dn = v
    for _ in range(n):
        up = np.nextafter(up, np.float32(np.inf))
        dn = np.nextafter(dn, np.float32(-np.inf))
        out += [up, dn]
    return out


E2M1_TIES = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
E2M1_VALUES = (0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def e4m3_values() -> np.ndarray:
    """All finite non-negative float8_e4m3fn values, ascending (0 .. 448)."""
    return np.arange(0, 0x7F, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32)


def e4m3_midpoints() -> np.ndarray:
    v = e4m3_values().astype(np.float64)
    return ((v[:-1] + v[1:]) / 2).astype(np.float32)  # exact: at most 5 significant bits


def _pack_rows(blocks, amax, seed):
    """Lay out 16-element blocks as rows [amax, 15 zeros | block | block | block], padded with
    rows of the same form, into [C, 32, 64] with C a multiple of CASES_PER_FAMILY.

    Every row holds the amax, so S_enc == 1 both per tensor and per token.
    """
    r = np.random.default_rng(seed)
    per_row = COLS // 16 - 1
    n_rows = -(-len(blocks) // per_row)
    per_fam = CASES_PER_FAMILY * ROWS
    n_rows = -(-n_rows // per_fam) * per_fam
    x = np.zeros((n_rows, COLS), np.float32)
    x[:, 0] = amax
    for i, blk in enumerate(blocks):
        row, slot = divmod(i, per_row)
        x[row, 16 * (slot + 1) : 16 * (slot + 2)] = blk
    # random signs on the amax element (|A| is what sets S_enc)
    x[:, 0] *= np.where(r.random(n_rows) < 0.5, -1, 1).astype(np.float32)
    return x.reshape(-1, ROWS, COLS)


def e2m1_tie_family(e: int):
    """Blocks whose maximum is 6*s (so sf = s exactly under map-to-6 with S_enc = 1) and
    whose other elements are s * (every E2M1 tie and grid value and their +-2 float32
    neighbours), both signs; s runs over powers of two. A = 6E."""
    vals = []
    for t in E2M1_TIES + E2M1_VALUES:
        vals += _neighbours(t, 2)
    vals = np.array(vals, np.float32)
    blocks = []
    for s in (2.0**-4, 2.0**-1, 1.0, 4.0, 32.0):
        if 6 * s > 6 * e:
            continue
        for sign in (1.0, -1.0):
            for start in range(0, len(vals), 15):
                chunk = vals[start : start + 15]
                blk = np.zeros(16, np.float32)
                blk[0] = 6 * s
                blk[1 : 1 + len(chunk)] = (sign * chunk * s).astype(np.float32)
                blocks.append(blk)
    return _pack_rows(blocks, np.float32(6 * e), seed=e)


def e4m3_tie_family(e: int):
    """Blocks whose maximum b puts the block scale on an E4M3 value or tie (and +-3 float32
    neighbours): b = 6*m (map-to-6 / sf6 on m) and b = 4*m (sf4 = 1.5*base on m), for every
    E4M3 value and midpoint m, subnormals included; A = 6E, so S_enc = 1. The other 15
    elements are random fractions of b with random signs."""
    r = np.random.default_rng(1000 + e)
    targets = np.concatenate([e4m3_values()[1:], e4m3_midpoints()])
    bs = []
    for m in targets:
        for mult in (6.0, 4.0):
            b0 = np.float32(m * mult)
            if b0 > 6 * e:
                continue
            for b in _neighbours(b0, 3):
                bs.append(b)
    blocks = []
    for b in bs:
        blk = (r.uniform(-1, 1, 16) * b).astype(np.float32)
        blk[r.integers(16)] = b * (1 if r.random() < 0.5 else -1)
        blk = np.clip(blk, -b, b)
        blocks.append(blk)
    return _pack_rows(blocks, np.float32(6 * e), seed=2000 + e)


def sum_order_family(e: int):
    """Blocks on which the 4/6 decision is decided by float32 rounding of the error sums, so
    the summation order of §3 (sequential over 16 elements; pairwise tree over the 16 rows of
    a 2D tile) is pinned. A = 6E with E the family's bound, so S_enc = 1 when it matches the
    config's, and every d is exact (Sterbenz); with scale s (a power of two) each block holds
      6s (both candidates exact), x_a = 4.5s + eps (map-6 err 0.5s + eps, map-4 err eps),
      x_b = 4s - eps (map-6 err eps, map-4 err 0.5s + eps),
    so MAE and MSE tie exactly in real arithmetic, plus 13 elements that both candidates
    round alike (0, 1.5s, 3s, each + a random eta spanning 2^-22 .. 2^-4 relative), which
    make the float32 partial sums round differently in different orders."""
    r = np.random.default_rng(3000 + e)
    per_row = COLS // 16 - 1
    n_blocks = CASES_PER_FAMILY * ROWS * per_row
    # one s per 16x16 tile (block i sits in row i // per_row, slot i % per_row), so that
    # under 2D tiles every row of a tile is such a near-tie and the tree sum decides
    tile_s = 2.0 ** r.integers(-4, 3, (n_blocks // per_row // 16, per_row))
    blocks = []
    for i in range(n_blocks):
        s = np.float32(tile_s[i // per_row // 16, i % per_row])
        eps = np.float32(s * 2.0 ** r.uniform(-20, -6))
        base = r.choice([0.0, 1.5, 3.0], 13) * s
        eta = s * np.exp2(r.uniform(-22, -4, 13)) * r.choice([-1, 1], 13)
        rest = (base + eta).astype(np.float32)
        vals = np.concatenate([[6 * s, 4.5 * s + eps, 4 * s - eps], rest]).astype(np.float32)
        signs = r.choice([-1, 1], 16).astype(np.float32)
        blocks.append(vals[r.permutation(16)] * signs)
    return _pack_rows(blocks, np.float32(6 * e), seed=4000 + e)


def random_families():
    """name -> [C, 32, 64] float32 for the random families."""
    return {
        "normal": normal(),
        "student_t2": student_t(),
        "tiny_1e-6": tiny(),
        "huge_1e30": huge(),
        "zeros": zeros(),
        "mixed_zero_blocks": mixed_zero_blocks(),
        "llm_outliers": llm_activations(),
    }


def tie_families():
    """name -> [C, 32, 64]: E2M1 and E4M3 ties with their float32 neighbours, for A = 6*256
    and A = 6*448 (S_enc = 1 exactly when the config's E matches, else a plain input)."""
    return {
        "e2m1_ties_A1536": e2m1_tie_family(256),
        "e2m1_ties_A2688": e2m1_tie_family(448),
        "e4m3_ties_A1536": e4m3_tie_family(256),
        "e4m3_ties_A2688": e4m3_tie_family(448),
        "sum_order_A1536": sum_order_family(256),
        "sum_order_A2688": sum_order_family(448),
    }


def all_families():
    return {**random_families(), **tie_families()}


# ------------------------------------------------------------------------------------------
# MX families ([..., K] with K a multiple of 32)

def mx_families():
    r = np.random.default_rng(77)
    fams = {
        "normal": r.standard_normal((64, 128)).astype(np.float32),
        "student_t2": r.standard_t(2, (64, 128)).astype(np.float32),
        "tiny_1e-6": (r.standard_normal((64, 128)) * 1e-6).astype(np.float32),
        "huge_1e30": (r.standard_normal((64, 128)) * 1e30).astype(np.float32),
        "zeros": np.zeros((8, 128), np.float32),
    }
    # MXFP4 clip: block amax in [4, 8) * 2^k lands the scaled max in [4, 8): (6, 8) clips to 6.
    clip = np.zeros((16, 32), np.float32)
    for i in range(16):
        top = np.float32(4 + 4 * i / 16 + 0.1)  # 4.1 .. 7.85
        clip[i, :] = np.linspace(-top, top, 32, dtype=np.float32)
        clip[i, 0] = top
    fams["mxfp4_clip_6_8"] = np.concatenate([clip, clip * np.float32(2.0**-5), clip * np.float32(2.0**9)])
    # powers of two and their neighbours as block maxima (RCEIL / floor edges); elements at
    # E4M3 / E2M1 ties after the power-of-two division.
    edges = []
    for k in range(-20, 21, 3):
        for base in (1.0, 448.0, 6.0, 7.0, 8.0):
            for amax in _neighbours(np.float32(base * 2.0**k), 2):
                row = np.zeros(32, np.float32)
                row[0] = amax
                row[1:8] = np.float32(2.0**k) * np.array([0.25, 0.75, 2.5, 5.0, 3.5, 1.25, 1.75], np.float32)
                mids = e4m3_midpoints()
                row[8:32] = (mids[r.integers(len(mids), size=24)] * np.float32(2.0**k) / 64).astype(np.float32)
                row[8:32] = np.clip(row[8:32], -amax, amax)
                edges.append(row)
    fams["pow2_edges"] = np.array(edges, np.float32).reshape(-1, 64)
    return fams
