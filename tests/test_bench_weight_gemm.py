"""bench_weight_gemm's plumbing on the CPU (kernels in their interpreters, a tiny shape; GPU numbers
come from the H200): every candidate is checked against the f32 einsum before it is timed, each
Triton kernel keeps its fastest launch shape, and a wrong kernel stops the benchmark."""

import dataclasses

import pytest

from experiments import bench_weight_gemm as bench



@pytest.fixture
def tiny_shape(monkeypatch):
    monkeypatch.setitem(bench.SHAPES, "tiny", (2, 64, 32))
    calls = iter(range(1, 10_000))
    monkeypatch.setattr(bench, "median_seconds", lambda fn, *args, iters: (fn(*args), next(calls) * 1e-6)[1])
    return bench.WeightGemmBenchConfig(shapes=("tiny",), rows_per_expert=(20,), block_m=(16, 32, 64), block_n=(16,),
                                       block_k=(32,), iters=1, interpret=True)


def test_every_candidate_is_checked_then_the_fastest_launch_shape_kept(tiny_shape):
    result = bench.run(tiny_shape)
    names = [r["name"] for r in result["rows"]]
    # the stub's times grow with each call: the first launch shape tried is the fastest;
    # 20 rows per expert: row tiles of 16 and 32 (64 only computes padding)
    assert names == ["xla bf16", "mosaic bf16", "emulated nvfp4 (xla)", "triton bf16 [16x16x32]",
                     "triton nvfp4 packed bf16 [16x16x32]", "triton nvfp4 packed f16 [16x16x32]"]
    assert [r.get("launch_shapes") for r in result["rows"]][3:] == [2, 2, 2] and not result["failures"]
    assert all(r["rel_error"] < 1e-5 and r["rows_per_expert"] == 20 for r in result["rows"])
    table = bench.to_markdown(result)
    assert table.count("| tiny |") == 6 and "1.00x" in table and "(of 2)" in table


def test_a_launch_shape_that_does_not_run_is_reported_not_timed(tiny_shape, monkeypatch):
    exact = bench.grouped_matmul_bf16

    def bf16_without_tall_tiles(*args, tiles, **kwargs):
        if tiles.block_m == 32:
            raise RuntimeError("out of resources: shared memory\nmore detail")
        return exact(*args, tiles=tiles, **kwargs)

    monkeypatch.setattr(bench, "grouped_matmul_bf16", bf16_without_tall_tiles)
    result = bench.run(tiny_shape)
    assert [f["name"] for f in result["failures"]] == ["triton bf16 [32x16x32]"]
    assert result["failures"][0]["error"] == "RuntimeError: out of resources: shared memory"
    assert [r.get("launch_shapes") for r in result["rows"] if r["name"].startswith("triton bf16")] == [1]
    assert "did not run (not timed)" in bench.to_markdown(result)


def test_a_wrong_kernel_stops_the_benchmark(tiny_shape, monkeypatch):
    exact = bench.grouped_matmul_nvfp4
    monkeypatch.setattr(bench, "grouped_matmul_nvfp4", lambda *a, **k: exact(*a, **k) * 1.001)
    with pytest.raises(AssertionError, match="triton nvfp4 packed .* relative error"):
        bench.run(dataclasses.replace(tiny_shape, rows_per_expert=(1,)))


def test_unknown_shape_names_the_valid_ones():
    with pytest.raises(ValueError, match="valid options"):
        bench.WeightGemmBenchConfig(shapes=("nope",))


def test_profile_adds_each_kernels_trace_summary(tiny_shape, tmp_path):
    config = dataclasses.replace(tiny_shape, block_m=(16,), profile=str(tmp_path / "traces"))
    result = bench.run(config)
    assert all(r["trace"].startswith("## Where one call's time goes: tiny, 20 rows/expert, ") for r in result["rows"])
    table = bench.to_markdown(result)
    assert table.count("## Where one call's time goes") == 6 and "| event |" in table


def test_wgmma_rows_where_n_holds_whole_warpgroups(tiny_shape, monkeypatch):
    """N a multiple of 64: the WGMMA kernel in both operand forms, each its fastest launch shape
    (row tiles up to the rows per expert); "vs best bf16" compares with bf16-weight rows only."""
    monkeypatch.setitem(bench.SHAPES, "tiny64", (2, 64, 64))
    config = dataclasses.replace(tiny_shape, shapes=("tiny64",), block_m=(16,), wgmma_rows=(8, 16, 32, 64),
                                 wgmma_stages=(2,), wgmma_block_n=(64, 128))
    result = bench.run(config)
    rows = {r["name"]: r for r in result["rows"]}
    # rows 8, 16, 32 at block_n 64; block_n 128 is no launch shape where N = 64
    assert rows["wgmma nvfp4 packed f16 registers [8x64x32 s2]"]["launch_shapes"] == 3
    assert rows["wgmma nvfp4 packed f16 smem [8x64x32 s2]"]["weight"] == "nvfp4"
    assert {r["weight"] for r in result["rows"] if "bf16" in r["name"]} == {"bf16", "nvfp4"}  # packed bf16 is nvfp4
    assert not result["failures"] and all(r["rel_error"] < 1e-5 for r in result["rows"])
    table = bench.to_markdown(result)
    best_bf16 = min(r["us"] for r in result["rows"] if r["weight"] == "bf16")
    row = rows["triton nvfp4 packed bf16 [16x16x32]"]
    assert f"| {best_bf16 / row['us']:.2f}x |" in table.split("triton nvfp4 packed bf16")[1].splitlines()[0]
