"""The SASS counters of tools/ (triton_sass.count_sass, mosaic_sass) on a made-up listing."""

from __future__ import annotations

import tarfile

import pytest

from tests.tool_module import load_tool

LISTING = """
        code for sm_90a
                Function : fp4rl_grouped_nvfp4_wgmma
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   S2R R0, SR_TID.X ;
        /*0020*/                   LOP3.LUT R2, R0, 0x7, RZ, 0xc0, !PT ;
        /*0030*/                   PRMT R3, R2, 0x5410, R2 ;
        /*0040*/                   HMUL2 R4, R3, R3 ;
        /*0050*/               @P0 BRA 0x20 ;
        /*0060*/                   EXIT ;
                Function : other_kernel
        /*0000*/                   NOP ;
        /*0010*/                   EXIT ;
"""


def test_count_sass_finds_the_loop_and_its_opcodes():
    counts = load_tool("triton_sass").count_sass(LISTING.split("Function : other_kernel")[0])
    assert counts["sass_total"] == 7 and counts["to_first_exit"] == 7
    assert counts["loop_body"] == 4  # 0x20..0x50: LOP3, PRMT, HMUL2, BRA
    assert counts["loop_top"] == {"LOP3": 1, "PRMT": 1, "HMUL2": 1, "BRA": 1}


def test_mosaic_sass_reads_a_dump_tarball(tmp_path, capsys):
    dump = tmp_path / "mosaic_dump"
    dump.mkdir()
    (dump / "module.sass").write_text(LISTING)
    (dump / "module.ptx").write_text("// no SASS here")
    with tarfile.open(tmp_path / "dump.tgz", "w:gz") as tar:
        tar.add(dump, arcname="mosaic_dump")
    tool = load_tool("mosaic_sass")
    tool.main([str(tmp_path / "dump.tgz"), "--kernel", "nvfp4_wgmma", "--per_step_elements", "512"])
    out = capsys.readouterr().out
    assert "fp4rl_grouped_nvfp4_wgmma: 7 instructions, loop body 4 (1.0 per weight element per thread)" in out
    assert "other_kernel" not in out
    with pytest.raises(SystemExit, match="no kernel matching"):
        tool.main([str(dump), "--kernel", "absent"])
    with pytest.raises(SystemExit, match="no SASS listing"):
        tool.main([str(tmp_path / "nothing")])
