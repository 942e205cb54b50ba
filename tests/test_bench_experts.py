"""bench_experts' MoE-block rows on the CPU (a few tokens; GPU numbers come from the H200): each
backend is checked against the first before it is timed, and `--profile` adds, per timed row, the
table of where one call's time went."""

from experiments import bench_experts as bench


def test_moe_block_rows_profiled_say_where_the_time_goes(tmp_path, monkeypatch):
    monkeypatch.setattr(bench, "median_seconds", lambda fn, *args, iters: (fn(*args), 1e-3)[1])
    config = bench.ExpertBenchConfig(tokens=128, gemms="xla", iters=1, moe_block_only=True, profile=str(tmp_path))
    result = bench.run(config)
    names = [r["name"] for r in result["rows"]]
    assert names == [f"MoE block (h200, 32 tokens) fwd+bwd, {recipe} recipe, expert_gemm=xla" for recipe in ("bf16", "full")]
    assert all(r["checked"] and r["ms"] == 1.0 for r in result["rows"])
    table = bench.to_markdown(result)
    for recipe in ("bf16", "full"):
        assert f"Where the time of one `MoE block (h200, 32 tokens) fwd+bwd, {recipe} recipe, expert_gemm=xla` call goes" in table
        assert (tmp_path / f"{recipe}-xla").is_dir()
    assert table.count("| event | count") == 2  # one kernel table per profiled row

