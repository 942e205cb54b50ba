"""The interpreter's 1D config subset (`quant_cases.COVERING_1D_CONFIGS`) covers what it says."""

import itertools

from tests.kernels.quant_cases import ALL_CONFIGS, COVERING_1D_CONFIGS, config_id


def test_the_1d_subset_covers_each_scale_with_every_mode_and_maximum_and_each_rule_with_every_maximum():
    by_id = {config_id(c): c for c in ALL_CONFIGS if not c.block_2d}
    assert set(COVERING_1D_CONFIGS) <= set(by_id) and len(set(COVERING_1D_CONFIGS)) == len(COVERING_1D_CONFIGS)
    chosen = [by_id[i] for i in COVERING_1D_CONFIGS]
    everything = list(by_id.values())

    def pairs(configs, first, second):
        return {(first(c), second(c)) for c in configs}

    def mode(c):
        return (c.four_over_six, c.fast_error)

    for first, second in [(lambda c: c.scale, mode), (lambda c: c.scale, lambda c: c.e4m3_max)]:
        assert pairs(chosen, first, second) == pairs(everything, first, second)
    rules = [c for c in chosen if c.four_over_six is not None]
    assert pairs(rules, lambda c: c.four_over_six, lambda c: c.e4m3_max) == set(
        itertools.product(("mae", "mse"), (None, 256, 448)))
