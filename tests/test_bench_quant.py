"""bench_quant's check-before-timing logic, on the CPU with tiny shapes (GPU numbers come from the H200):
every backend is compared byte for byte with the CPU reference on the first rows/experts, and a
backend that differs is reported and not timed."""

import dataclasses

from experiments import bench_quant

SMALL = bench_quant.BenchConfig(backends=("xla",), activation_shapes=("64x64",), experts=2, expert_shape="64x32",
                                iters=1, check_rows=16, check_experts=1)


def test_every_variant_is_checked_then_timed():
    rows = bench_quant.run(SMALL)["rows"]
    assert len(rows) == 2 * len(bench_quant.VARIANTS) + 1  # activations + expert stack + amax-given diagnostic
    assert [r["variant"] for r in rows].count(bench_quant.AMAX_GIVEN) == 1
    assert all(r["bit_exact"] and r["ms"] > 0 for r in rows), rows


def test_a_backend_with_one_wrong_byte_is_not_timed(monkeypatch):
    exact = bench_quant.quantizer

    def quantizer(backend, config, experts, **options):
        fn = exact("xla", config, experts)
        if backend != "broken":
            return fn
        return lambda x: dataclasses.replace(fn(x), codes=fn(x).codes.at[(0,) * fn(x).codes.ndim].add(1))

    monkeypatch.setattr(bench_quant, "quantizer", quantizer)
    rows = bench_quant.run(dataclasses.replace(SMALL, backends=("xla", "broken")))["rows"]
    broken = [r for r in rows if r["backend"] == "broken"]
    assert broken and all(r["bit_exact"] is False and "ms" not in r for r in broken)
    assert all(r["bit_exact"] for r in rows if r["backend"] == "xla")
    assert "**NO** (not timed)" in bench_quant.to_markdown({"device": "cpu", "copy_gbps_peak": 1.0, "rows": rows})
