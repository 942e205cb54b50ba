"""The studies: runners that train with `fp4rl.rl` and judge with `fp4rl.analysis`, one floor above
both (docs/design.md "Layout"): the ablation runner (`ablation`) and the fixed-parameter gradient
measurements (`gradients`, with their settings, programs and stored arrays)."""
