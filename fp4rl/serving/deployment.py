"""Which forward a deployment serves, and its weights quantized at load time.

A deployment quantizes a BF16 checkpoint once, at load, with no calibration data: the trainer's
weight sync (`fp4rl.model.sync.sync_weights`) under the deployment's recipe, on the recipe's
`forward_only()` view, exactly as the trainer syncs its rollout sampler. The served bytes are
therefore the bytes the trainer's sampler would use for the same params and recipe, and the
activations are quantized inside the forward as in training (per-token FP32 scales).

Quantization choices (the `--quantization` flag, named after SGLang's):

| quantization | recipe (default) | what is quantized |
|---|---|---|
| `bf16` | `bf16` | nothing |
| `mxfp8` | `mxfp8` | the MoE linears (routed and shared experts) in MXFP8, W and A: the FP8 deployment |
| `nvfp4_online` | the checkpoint's training recipe when it is an NVFP4 recipe (an RL arm such as `full` or `nvfp4`), else `full` | the MoE linears in NVFP4 under that recipe |

Why `nvfp4_online` follows the training recipe: the seed serves an RL checkpoint with the forward
it was trained and sampled under (its rollouts already used those bytes), so the deployment adds
no train/serve mismatch. A checkpoint trained in BF16 (the warm-up, the `bf16` arm, an imported
model) has no NVFP4 recipe of its own; it gets `full`, the recipe whose forward the seed trains
with (4/6 on weights and activations; shared expert and the last ~15% of layers in BF16).
`recipe=NAME` overrides the default with any recipe of the matching format (e.g. `nvfp4` for plain
NVFP4 everywhere in the MoE linears).
"""

from __future__ import annotations

import dataclasses

from fp4rl.model import sync as model_sync
from fp4rl.recipe import SITE_KINDS, PrecisionRecipe
from fp4rl.serving.checkpoints import ServedModel

QUANTIZATIONS = ("bf16", "mxfp8", "nvfp4_online")
DEFAULT_RECIPES = {"bf16": "bf16", "mxfp8": "mxfp8", "nvfp4_online": "full"}
_FORMATS = {"bf16": "bf16", "mxfp8": "mxfp8", "nvfp4_online": "nvfp4"}


def recipe_formats(recipe: PrecisionRecipe) -> set[str]:
    """The formats of a recipe's quantized sites (empty for BF16)."""
    return {getattr(recipe, kind).format for kind in SITE_KINDS if getattr(recipe, kind).quantized}


def _matches(quantization: str, recipe: PrecisionRecipe) -> bool:
    formats = recipe_formats(recipe)
    return formats == set() if quantization == "bf16" else formats == {_FORMATS[quantization]}


def deployment_recipe(quantization: str, trained_recipe: str, recipe: str | None = None) -> PrecisionRecipe:
    """The recipe a deployment serves (module docstring); `recipe` overrides the default."""
    if quantization not in QUANTIZATIONS:
        raise ValueError(f"quantization={quantization!r}; valid options: {QUANTIZATIONS}")
    if recipe is not None:
        chosen = PrecisionRecipe.from_name(recipe)
        if not _matches(quantization, chosen):
            raise ValueError(f"recipe {recipe!r} quantizes in {sorted(recipe_formats(chosen)) or ['nothing']}, "
                             f"not in what quantization={quantization!r} serves ({_FORMATS[quantization]})")
        return chosen
    trained = PrecisionRecipe.from_name(trained_recipe)
    if quantization == "nvfp4_online" and _matches(quantization, trained):
        return trained
    return PrecisionRecipe.from_name(DEFAULT_RECIPES[quantization])


@dataclasses.dataclass(frozen=True)
class Deployment:
    """A checkpoint quantized for serving. `recipe` is the full recipe (its name is reported);
    `forward_recipe` its forward-only view, which the sync and the sampler run (as in the trainer).
    qparams: the synced weights; map4_frac: the share of NVFP4 weight blocks that chose map-4."""

    model: ServedModel
    quantization: str
    recipe: PrecisionRecipe
    forward_recipe: PrecisionRecipe
    qparams: object
    map4_frac: float
    impl: str


def quantize(model: ServedModel, quantization: str, recipe: str | None = None, impl: str = "auto") -> Deployment:
    """Quantize `model` at load time under the deployment's recipe with the trainer's sync."""
    chosen = deployment_recipe(quantization, model.trained_recipe, recipe)
    forward_recipe = chosen.forward_only()
    qparams, metrics = model_sync.sync_weights_jit(model.params, model.config, forward_recipe, impl)
    return Deployment(model, quantization, chosen, forward_recipe, qparams, float(metrics["quant/map4_frac"]), impl)
