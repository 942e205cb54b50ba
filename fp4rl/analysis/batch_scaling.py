"""Batch scaling and the FP4-All-the-Way yardstick of the fixed-parameter gradient measurements,
computed from what the measurement already keeps (no new rollouts).

Notation of `fp4rl.analysis.gradient_report`, per recipe r, parameter group and stored batch
b = 1..B: g_b the BF16 gradient, e_b = g_r,b - g_b the recipe's error on batch b (one key's draw,
what an update sees), d_b the error of the recipe's mean over its keys. The store keeps the Gram
matrices of d_b and of g_b and the per-batch squared errors, which give five moments (each an
unbiased estimate, per bootstrap resample of the batches):

  D  = mean_b E_key ||e_b||^2            (squared error of one batch's gradient)
  U  = mean_{b != b'} <d_b, d_b'>          (||E e||^2: the coherent error, squared)
  V  = sum_b ||g_b - mean g||^2 / (B - 1)  (the RL noise floor of one batch)
  S  = mean_{b != b'} <g_b, g_b'>          (||E g||^2: the BF16 signal, squared)
  Sd = mean_b ||g_b||^2                    (= S + V exactly, for these estimators)

An update on an effective batch of k stored batches takes their mean gradient (the loss is a
token mean, so for batches of similar token counts that is the gradient of their union). Averaged
over every k-subset of the B batches, exactly for k <= B (and as the same i.i.d. model beyond):

  E||mean_k e||^2 = D/k + (1 - 1/k) U,   E||mean_k g - E g||^2 = V/k,   E||mean_k g||^2 = Sd/k + (1 - 1/k) S,

so the rule's noise fraction at k batches is (D + (k - 1) U) / V: the noise floor falls as 1/k,
the coherent error does not, and a recipe that passes at one batch can exceed at a larger one.
In tokens per update T = k T0 (T0: loss tokens per stored batch) the same relations need three
quantities that do not depend on T:

  A   = (D - U) / V     incoherent error / noise (both fall as 1/T)
  b2  = U / S            coherent bias squared (gradient_report's `coherent_bias`, squared)
  T_s = T0 V / S         the noise scale in tokens (McCandlish et al. 2018, "An Empirical Model of
                         Large-Batch Training": B_noise = tr(Sigma) / |G|^2): noise = signal at T_s

  noise_fraction(T) = A + b2 T / T_s,    R(T)^2 = (1 + T_s / T) / (b2 + A T_s / T),

where R(T) = sqrt(E||g_T||^2 / E||e_T||^2) is the FP4-All-the-Way yardstick (Chmiel et al. 2025,
arXiv 2505.19115: quantized training stops being effective once the gradient norm falls below about
sqrt(3) times the quantization noise, i.e. R < sqrt(3)); g_T is the update's BF16 gradient (noise
included: what the optimizer sees) and e_T the recipe's error of that update (its departure from
BF16). R(T0) = 1 / rel_error. R moves monotonically from 1/sqrt(A) (small updates) to 1/sqrt(b2)
(large ones). The decision's threshold (1) is crossed at T* = T_s (threshold - A) / b2: 0 when
A >= threshold (exceeds at every update size), infinite when b2 <= 0 (no coherent error detected).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

SQRT3 = float(np.sqrt(3.0))


def quad(gram_BxB, counts_NxB):
    """||sum_b counts[n, b] x_b||^2 per resample row n, from the Gram matrix of the x_b."""
    return np.einsum("nb,bc,nc->n", counts_NxB, gram_BxB, counts_NxB)


def pair_mean(gram_BxB, counts_NxB):
    """Mean of <x_b, x_b'> over pairs of distinct batches (weighted by counts): unbiased ||E x||^2."""
    diag = np.diag(gram_BxB)
    with np.errstate(divide="ignore", invalid="ignore"):
        return (quad(gram_BxB, counts_NxB) - counts_NxB**2 @ diag) / (counts_NxB.sum(1) ** 2 - (counts_NxB**2).sum(1))


def batch_variance(gram_BxB, counts_NxB):
    """Unbiased variance over batches, sum_b ||x_b - mean x||^2 / (B - 1), per resample."""
    n = counts_NxB.sum(1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return (counts_NxB @ np.diag(gram_BxB) - quad(gram_BxB, counts_NxB) / n) / (n - 1)


def moments(error_sq_B, gram_diff_BxB, gram_bf16_BxB, counts_NxB) -> dict[str, np.ndarray]:
    """D, U, V, S, Sd (module docstring) per resample row of `counts_NxB` (row 0: the sample).

    error_sq_B: per batch E_key ||e_b||^2 (||d_b||^2 plus the keys' variance); gram_diff: Gram
    matrix of d_b; gram_bf16: Gram matrix of the BF16 gradients g_b. V is `batch_variance`, the
    noise floor of `gradient_report`, so noise_fraction_at(m, 1) is the rule's noise fraction in
    every resample (where a resample repeats a batch, Sd - S and V differ
    slightly: the pair means leave out the repeated pairs).
    """
    n = counts_NxB.sum(1)
    sd = counts_NxB @ np.diag(gram_bf16_BxB) / n
    return {"D": counts_NxB @ np.asarray(error_sq_B, np.float64) / n, "U": pair_mean(gram_diff_BxB, counts_NxB),
            "V": batch_variance(gram_bf16_BxB, counts_NxB), "S": pair_mean(gram_bf16_BxB, counts_NxB), "Sd": sd}


def _div(num, den):
    """num / den; +inf where den <= 0 and num > 0, nan where both are 0 (an empty group)."""
    num, den = np.broadcast_arrays(np.asarray(num, np.float64), np.asarray(den, np.float64))
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(den > 0, num / np.where(den > 0, den, 1.0), np.where(num > 0, np.inf, np.nan))


def components(m: Mapping[str, np.ndarray], tokens_per_batch: float) -> dict[str, np.ndarray]:
    """A, b2, T_s (module docstring) per resample."""
    return {"A": _div(m["D"] - m["U"], m["V"]), "b2": _div(m["U"], m["S"]),
            "Ts": tokens_per_batch * _div(m["V"], m["S"])}


def error_at(m, k):
    """E||mean of k batches' errors||^2."""
    return m["D"] / k + (1 - 1 / k) * m["U"]


def noise_floor_at(m, k):
    """The noise floor of an update of k batches: V / k."""
    return m["V"] / k


def noise_fraction_at(m, k):
    """The rule's noise fraction of an update of k batches: (D + (k - 1) U) / V."""
    return _div(error_at(m, k), noise_floor_at(m, k))


def yardstick_at(m, k):
    """R(k) = sqrt(E||mean_k g||^2 / E||mean_k e||^2); +inf where the error estimate is not positive
    (no error, or none detectable at that k)."""
    signal = m["Sd"] / k + (1 - 1 / k) * m["S"]
    return np.sqrt(np.maximum(_div(signal, error_at(m, k)), 0.0))


def tokens_to_threshold(c: Mapping[str, np.ndarray], threshold: float):
    """T*: tokens per update at which noise_fraction(T) = A + b2 T / T_s reaches `threshold`;
    0 where A >= threshold (above it at any update size), inf where b2 <= 0 (never reached)."""
    a, b2, ts = (np.asarray(c[k], np.float64) for k in ("A", "b2", "Ts"))
    with np.errstate(divide="ignore", invalid="ignore"):
        t = ts * (threshold - a) / b2
    return np.where(a >= threshold, 0.0, np.where(b2 > 0, t, np.inf))


def noise_fraction_tokens(c: Mapping[str, np.ndarray], tokens):
    """noise_fraction(T) = A + b2 T / T_s from the components (any broadcastable shapes)."""
    return np.asarray(c["A"]) + np.asarray(c["b2"]) * _div(tokens, c["Ts"])


def yardstick_tokens(c: Mapping[str, np.ndarray], tokens):
    """R(T) = sqrt((1 + T_s/T) / (b2 + A T_s/T)) from the components."""
    r = _div(c["Ts"], tokens)
    return np.sqrt(np.maximum(_div(1 + r, np.asarray(c["b2"]) + np.asarray(c["A"]) * r), 0.0))


def k_grid(batches: int) -> list[int]:
    """The effective batch sizes the report tabulates with intervals: 1, 2, 4, ... and B."""
    ks = [1 << i for i in range(batches.bit_length()) if 1 << i <= batches]
    return ks + ([batches] if ks[-1] != batches else [])
