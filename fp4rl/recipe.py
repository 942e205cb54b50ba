"""The precision recipe: which linear sites are quantized, how, and which stay BF16.

One `PrecisionRecipe` per ablation arm of docs/rl.md. It is frozen and JSON-serialisable so that
checkpoints, the trainer, the sampler and weight sync all resolve the same `SiteConfig` for
every (layer, site kind): selective high precision (intervention 3) is a property of the
recipe, not of any one code path.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Literal

from fp4rl.formats.nvfp4 import NVFP4Config

FORMATS = ("bf16", "nvfp4", "mxfp8")
BACKWARDS = ("bf16", "dequantized", "quantized")
ACT_SCALES = ("token", "tensor")
WEIGHT_BLOCKS = ("2d", "1d")
METRICS = (None, "mae", "mse")
SITE_KINDS = ("routed_experts", "shared_expert", "dense_mlp", "attention", "router", "embed", "lm_head")


@dataclasses.dataclass(frozen=True)
class SiteConfig:
    """How one linear site computes `x @ w` (hashable: a static jit argument).

    format: "bf16" | "nvfp4" | "mxfp8" (MX: 32-blocks along K, for the validation runs).
    weight_46 / act_46: Four-Over-Six metric on the weight / activation operand, or None.
    e4m3_max: E of docs/numerics.md §3 (None: 448 without 4/6, 256 with it).
    fast_error: the fast 4/6 error path.
    act_scale: per-token ("token", required for RL, docs/numerics.md §4) or per-tensor amax
      ("tensor": one amax over the whole [tokens, K] operand of the call, so a token's bytes depend
      on its batch; the positive control `nvfp4-tensor`).
    weight_block: "2d" (16x16 tiles, forward and backward see the same weight) or "1d".
    backward: "bf16" | "dequantized" | "quantized" (docs/numerics.md §7).
    amplification: a > 0, the dose of the dose-response arms (`nvfp4@A`, `+dq@A`): the forward runs
      on v_a = v + a * (DQ(Q(v)) - v) for the weight and the activation, formed in f32 and rounded
      once to bf16 (`fp4rl.qlinear`). An emulation: v_a is not NVFP4-representable for a != 1 (on
      Hopper the NVFP4 GEMMs run in bf16 on dequantized operands anyway). 1 is the site itself, the
      same code path and bytes; NVFP4 sites with backward "bf16" or "dequantized" only.
    """

    format: Literal["bf16", "nvfp4", "mxfp8"] = "bf16"
    weight_46: Literal["mae", "mse"] | None = None
    act_46: Literal["mae", "mse"] | None = None
    e4m3_max: int | None = None
    fast_error: bool = False
    act_scale: Literal["token", "tensor"] = "token"
    weight_block: Literal["2d", "1d"] = "2d"
    backward: Literal["bf16", "dequantized", "quantized"] = "bf16"
    amplification: float = 1.0

    def __post_init__(self):
        for name, value, valid in (
            ("format", self.format, FORMATS),
            ("backward", self.backward, BACKWARDS),
            ("act_scale", self.act_scale, ACT_SCALES),
            ("weight_block", self.weight_block, WEIGHT_BLOCKS),
            ("weight_46", self.weight_46, METRICS),
            ("act_46", self.act_46, METRICS),
        ):
            if value not in valid:
                raise ValueError(f"{name}={value!r}; valid options: {valid}")
        if self.format != "nvfp4" and (self.weight_46 or self.act_46):
            raise ValueError(f"Four-Over-Six applies to format='nvfp4' only, not {self.format!r}")
        a = self.amplification
        if isinstance(a, bool) or not isinstance(a, (int, float)) or not (math.isfinite(a) and a > 0):
            raise ValueError(f"amplification={a!r} must be a finite number > 0 (1: no amplification)")
        object.__setattr__(self, "amplification", float(a))  # 4 and 4.0: one static jit argument
        if a != 1 and (self.format != "nvfp4" or self.backward == "quantized"):
            raise ValueError(f"amplification={a} applies to format='nvfp4' sites with backward 'bf16' or "
                             f"'dequantized', not format={self.format!r}, backward={self.backward!r}")
        # Build the operand configs once so an invalid combination fails here, not in a trace.
        if self.format == "nvfp4":
            self.weight_config(), self.act_config()

    @property
    def quantized(self) -> bool:
        return self.format != "bf16"

    def weight_config(self) -> NVFP4Config:
        """NVFP4 config of the weight operand (per-tensor amax; 16x16 or 1x16 blocks)."""
        return NVFP4Config(
            block_2d=self.weight_block == "2d",
            scale="tensor",
            four_over_six=self.weight_46,
            e4m3_max=self.e4m3_max,
            fast_error=self.fast_error and self.weight_46 is not None,
        )

    def act_config(self) -> NVFP4Config:
        """NVFP4 config of the activation operand (1x16 blocks along K)."""
        return NVFP4Config(
            block_2d=False,
            scale=self.act_scale,
            four_over_six=self.act_46,
            e4m3_max=self.e4m3_max,
            fast_error=self.fast_error and self.act_46 is not None,
        )


BF16 = SiteConfig()


@dataclasses.dataclass(frozen=True)
class PrecisionRecipe:
    """Per site kind the SiteConfig, plus the selective-high-precision rule.

    keep_last_fraction: the last round(fraction * L) layers (half up, at least one when > 0) run
      every site in BF16; 0 disables the rule. Rounding to nearest keeps the kept share close to
      the fraction (0.15 keeps 1 of 6-9 layers, 2 of 10-16, 3 of 17-23: 12-19% at every depth
      from 6 on but 9 and 10, which have no such share; docs/rl.md "Precision recipes"); rounding
      up would keep 2 of 7 or 8 (25-29%).
    Router, embeddings and LM head are BF16 in every preset; norms are never quantized.
    """

    name: str
    routed_experts: SiteConfig = BF16
    shared_expert: SiteConfig = BF16
    dense_mlp: SiteConfig = BF16
    attention: SiteConfig = BF16
    router: SiteConfig = BF16
    embed: SiteConfig = BF16
    lm_head: SiteConfig = BF16
    keep_last_fraction: float = 0.0

    def __post_init__(self):
        if not 0.0 <= self.keep_last_fraction < 1.0:
            raise ValueError(f"keep_last_fraction={self.keep_last_fraction} must be in [0, 1)")

    def num_high_precision_layers(self, num_layers: int) -> int:
        """round(fraction * L), half up, and at least one layer when the rule is on."""
        if self.keep_last_fraction == 0.0:
            return 0
        return max(1, math.floor(self.keep_last_fraction * num_layers + 0.5 + 1e-9))

    def high_precision_summary(self, num_layers: int) -> str:
        """"k of L layers kept in BF16 (p%)": the line every report states for this recipe."""
        k = self.num_high_precision_layers(num_layers)
        return f"{k} of {num_layers} layers kept in BF16 ({100 * k / num_layers:.1f}%)"

    def layer_map(self, num_layers: int, has_shared_expert: bool) -> dict:
        """Where this recipe puts which format in a model of `num_layers` layers: the layers kept
        in BF16 (every site), and the routed and shared experts' format elsewhere (None where the
        model has no shared expert). A checkpoint stores it, so a run resumed on another model
        depth or architecture is refused even when the recipe's own fields are the same."""
        k = self.num_high_precision_layers(num_layers)
        return {"num_layers": num_layers, "bf16_layers": list(range(num_layers - k, num_layers)),
                "summary": self.high_precision_summary(num_layers), "routed_experts": self.routed_experts.format,
                "shared_expert": self.shared_expert.format if has_shared_expert else None}

    def site(self, kind: str, layer: int | None, num_layers: int) -> SiteConfig:
        """The SiteConfig of site `kind` in layer `layer` of `num_layers` (layer None: embed/head)."""
        if kind not in SITE_KINDS:
            raise ValueError(f"site kind {kind!r}; valid options: {SITE_KINDS}")
        if layer is not None:
            if not 0 <= layer < num_layers:
                raise ValueError(f"layer={layer} out of range for num_layers={num_layers}")
            if layer >= num_layers - self.num_high_precision_layers(num_layers):
                return BF16
        return getattr(self, kind)

    def forward_only(self) -> "PrecisionRecipe":
        """The same forward with every site's backward made "dequantized", named "forward-only".

        A forward never depends on the backward mode, but a "quantized" backward makes the
        forward derive per-site keys; programs that only run the forward (weight sync, sampler,
        log-probs) use this view. The views of arms that differ only in their backward are
        equal, name included, so such arms share one jitted program (one trace, one compile):
        nvfp4 / nvfp4-pt / +dq, +46 / full-hp, +hp / full-46, full / full-dq, and
        mxfp8-q / mxfp8 / mxfp8+dq.
        """
        sites = {k: dataclasses.replace(getattr(self, k), backward="dequantized") if getattr(self, k).quantized
                 else getattr(self, k) for k in SITE_KINDS}
        return dataclasses.replace(self, name="forward-only", **sites)

    def to_json(self) -> str:
        """JSON of every field, but a site's `amplification` only where it is not 1: the recipes
        without a dose keep the JSON their checkpoints stored (a resume compares it as text)."""
        data = dataclasses.asdict(self)
        for kind in SITE_KINDS:
            if data[kind]["amplification"] == 1.0:
                del data[kind]["amplification"]
        return json.dumps(data, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "PrecisionRecipe":
        data = json.loads(text)
        sites = {k: SiteConfig(**data.pop(k)) for k in SITE_KINDS}
        return cls(**data, **sites)

    @classmethod
    def from_name(cls, name: str) -> "PrecisionRecipe":
        """A named recipe: a preset (`names()`), or a dose `nvfp4@A` / `+dq@A` for any number A > 0
        (`dose_arm`), written as `dose_name` writes it (`nvfp4@4`, not `nvfp4@4.0`)."""
        if name in PRESETS:
            return PRESETS[name]
        base, at, dose = name.partition("@")
        if not at:
            raise ValueError(f"unknown recipe {name!r}; valid names: {tuple(PRESETS)}, or {DOSE_PATTERN}")
        if base not in DOSE_BASES:
            raise ValueError(f"recipe {name!r}: a dose applies to {DOSE_BASES} ({DOSE_PATTERN}), not to {base!r}")
        try:
            a = float(dose)
        except ValueError:
            raise ValueError(f"recipe {name!r}: the amplification {dose!r} is not a number ({DOSE_PATTERN})") from None
        if not (math.isfinite(a) and a > 0):
            raise ValueError(f"recipe {name!r}: the amplification must be a finite number > 0 ({DOSE_PATTERN})")
        if dose_name(base, a) != name:  # one spelling per recipe: arm directories and recipe names agree
            raise ValueError(f"recipe {name!r}: write it {dose_name(base, a)!r}")
        return dose_arm(base, a)

    @staticmethod
    def names() -> tuple[str, ...]:
        """The presets, the registered doses (`DOSE_RESPONSE_DOSES`) included; `from_name` also
        takes any other dose (`DOSE_PATTERN`)."""
        return tuple(PRESETS)


def _arm(name: str, *, backward: Literal["bf16", "dequantized", "quantized"], four_over_six: bool,
         high_precision: bool, fmt: str = "nvfp4", attention: bool = False,
         act_scale: Literal["token", "tensor"] = "token") -> PrecisionRecipe:
    """One arm of docs/rl.md "The ablation matrix": the MoE linears in `fmt` (routed experts, and the
    shared expert unless intervention 3 keeps it BF16) with the backward `backward`; attention,
    dense MLPs, router, embeddings and head stay BF16, as in the paper. `attention=True` also
    quantizes attention (q|k|v, o) and the dense MLPs: the named extra variants `*+attn`, not part
    of the nine arms.

    backward (docs/numerics.md §7), stated by every arm:
    - "bf16": quantized forward, BF16 backward on the raw weight and activation: the paper's
      baseline, and every arm without the dequantized backward (nvfp4, +46, +hp, full-dq, mxfp8);
    - "dequantized": intervention 1 (+dq, full, full-46, full-hp, mxfp8+dq);
    - "quantized": the NVFP4 pretraining recipe's quantized backward (SR gradients, RHT on wgrad,
      16x16 weight blocks: `nvfp4-pt`); with MXFP8 the backward operands re-quantized to MXFP8
      (no SR/RHT: `mxfp8-q`).
    Every NVFP4 arm has 16x16 weight blocks and per-token FP32 activation scales, but the positive
    control `nvfp4-tensor` (`act_scale="tensor"`).
    """
    metric = "mae" if four_over_six else None
    quantized = SiteConfig(format=fmt, weight_46=metric, act_46=metric, weight_block="2d", backward=backward,
                           act_scale=act_scale)
    return PrecisionRecipe(
        name=name,
        routed_experts=quantized,
        shared_expert=BF16 if high_precision else quantized,
        dense_mlp=quantized if attention else BF16,
        attention=quantized if attention else BF16,
        keep_last_fraction=0.15 if high_precision else 0.0,
    )


PRESETS: dict[str, PrecisionRecipe] = {
    "bf16": PrecisionRecipe(name="bf16"),
    # The nine arms of the ablation matrix: {dq} x {4/6} x {selective high precision}.
    "nvfp4": _arm("nvfp4", backward="bf16", four_over_six=False, high_precision=False),
    "+dq": _arm("+dq", backward="dequantized", four_over_six=False, high_precision=False),
    "+46": _arm("+46", backward="bf16", four_over_six=True, high_precision=False),
    "+hp": _arm("+hp", backward="bf16", four_over_six=False, high_precision=True),
    "full": _arm("full", backward="dequantized", four_over_six=True, high_precision=True),
    "full-dq": _arm("full-dq", backward="bf16", four_over_six=True, high_precision=True),
    "full-46": _arm("full-46", backward="dequantized", four_over_six=False, high_precision=True),
    "full-hp": _arm("full-hp", backward="dequantized", four_over_six=True, high_precision=False),
    # The other baselines the paper discusses: the NVFP4 pretraining recipe (its claim: not
    # sufficient for RL) and the MXFP8 validation's three recipes (MXFP8, BF16, dequantized backward).
    "nvfp4-pt": _arm("nvfp4-pt", backward="quantized", four_over_six=False, high_precision=False),
    "mxfp8-q": _arm("mxfp8-q", backward="quantized", four_over_six=False, high_precision=False, fmt="mxfp8"),
    "mxfp8": _arm("mxfp8", backward="bf16", four_over_six=False, high_precision=False, fmt="mxfp8"),
    "mxfp8+dq": _arm("mxfp8+dq", backward="dequantized", four_over_six=False, high_precision=False, fmt="mxfp8"),
    # Extra variants: attention and dense MLPs quantized too (beyond the paper's recipe).
    "nvfp4+attn": _arm("nvfp4+attn", backward="bf16", four_over_six=False, high_precision=False, attention=True),
    "full+attn": _arm("full+attn", backward="dequantized", four_over_six=True, high_precision=True, attention=True),
    # Positive control: nvfp4 with one activation amax per tensor. The sampler's scale then spans
    # its whole batch (prefill) or decode step, the trainer's its micro-batch, so a token quantizes
    # differently in each (docs/numerics.md §4): RL with such scales is known to diverge.
    "nvfp4-tensor": _arm("nvfp4-tensor", backward="bf16", four_over_six=False, high_precision=False,
                         act_scale="tensor"),
}

ABLATION_ARMS = ("bf16", "nvfp4", "+dq", "+46", "+hp", "full", "full-dq", "full-46", "full-hp")
# The baselines beside the nine arms: the pretraining recipe and the MXFP8 validation recipes.
BASELINE_ARMS = ("nvfp4-pt", "mxfp8-q", "mxfp8", "mxfp8+dq")
# Arms that must show the effect if the instruments can see it (docs/rl.md "The ablation matrix").
POSITIVE_CONTROL_ARMS = ("nvfp4+attn", "nvfp4-tensor")

# ---------------------------------------------------------------- dose-response of the mismatch
# The paper's forward/backward mismatch, amplified: `nvfp4@A` (BF16 backward on the raw operands,
# the mismatch grows with A) against `+dq@A` (the backward of the amplified forward: no mismatch).
DOSE_BASES = ("nvfp4", "+dq")
DOSE_RESPONSE_DOSES = (1, 4, 16, 64)
DOSE_PATTERN = "nvfp4@A or +dq@A for an amplification A > 0 (e.g. nvfp4@4, +dq@16)"


def dose_name(base: str, amplification: float) -> str:
    """The arm name, e.g. nvfp4@4 or +dq@0.5: the amplification as Python writes the float, without ".0"."""
    text = repr(float(amplification))
    return f"{base}@{text[:-2] if text.endswith('.0') else text}"


def dose_arm(base: str, amplification: float) -> PrecisionRecipe:
    """`base` (nvfp4 or +dq) with every quantized site's `amplification` set: its forward on
    w_a = w + a * (DQ(Q(w)) - w) and x_a = x + a * (DQ(Q(x)) - x) (an emulation, see
    `SiteConfig`), its backward `base`'s: "bf16" on raw w and x, or "dequantized" on w_a and x_a.
    At a = 1 the sites are `base`'s own, so the programs are `base`'s; only the name differs."""
    if base not in DOSE_BASES:
        raise ValueError(f"a dose applies to {DOSE_BASES}, not to {base!r}")
    recipe = PRESETS[base]
    sites = {k: dataclasses.replace(getattr(recipe, k), amplification=amplification)
             for k in SITE_KINDS if getattr(recipe, k).quantized}
    return dataclasses.replace(recipe, name=dose_name(base, amplification), **sites)


def dose_response_arms(doses=DOSE_RESPONSE_DOSES) -> tuple[str, ...]:
    """The arm names of a dose-response, per dose the two backwards: ("nvfp4", "+dq", "nvfp4@4",
    "+dq@4", ...). Dose 1 is the recipes themselves, so it names them (the same programs)."""
    return tuple(base if float(a) == 1.0 else dose_name(base, a) for a in doses for base in DOSE_BASES)


# The registered doses are presets too (`names()`), like the other extra variants.
PRESETS.update({dose_name(base, a): dose_arm(base, a) for a in DOSE_RESPONSE_DOSES if a != 1 for base in DOSE_BASES})


# ---------------------------------------------------------------- views of a recipe's gradient
def straight_through(recipe: PrecisionRecipe) -> PrecisionRecipe:
    """The recipe's quantized forward with a BF16 backward on raw operands (straight-through), named
    "straight-through"; arms with the same forward get equal views, and a recipe without quantized
    sites is itself. A recipe with a BF16 backward differs from its view in its name only
    (`is_straight_through`)."""
    quantized = [k for k in SITE_KINDS if getattr(recipe, k).quantized]
    if not quantized:
        return recipe
    sites = {k: dataclasses.replace(getattr(recipe, k), backward="bf16") for k in quantized}
    return dataclasses.replace(recipe, name="straight-through", **sites)


def is_straight_through(recipe: PrecisionRecipe) -> bool:
    """Whether the recipe's gradient is its own straight-through gradient (every backward BF16)."""
    return straight_through(recipe) in (recipe, dataclasses.replace(recipe, name="straight-through"))


def draws_keys(recipe: PrecisionRecipe) -> bool:
    """Only NVFP4's quantized backward is random (stochastic rounding, random Hadamard transform);
    MXFP8's re-quantizes deterministically (qlinear)."""
    sites = [getattr(recipe, k) for k in SITE_KINDS]
    return any(site.format == "nvfp4" and site.backward == "quantized" for site in sites)
