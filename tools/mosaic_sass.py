"""Count the SASS of Mosaic GPU kernels from the dumps a GPU run leaves (no GPU needed to read them).

Mosaic GPU compiles its kernels inside XLA:GPU's compile, so their SASS exists only on a machine
with the CUDA plugin. A run with

    MOSAIC_GPU_DUMP_SASS=1 MOSAIC_GPU_DUMP_RESOURCES=1 MOSAIC_GPU_DUMP_TO=DIR python ...

writes each kernel's listing under DIR (`bash tools/gpu_session.sh wgmma_sass` tars it into
mosaic_dump.tgz). This reads DIR or the tarball and prints, per kernel whose name contains
--kernel: the instruction count, the largest loop's body (a pipelined GEMM's K step) and the most
frequent opcodes in it (`tools/triton_sass.count_sass`, the same counts as for the Triton kernels).

    python tools/mosaic_sass.py mosaic_dump.tgz [--kernel fp4rl_grouped_nvfp4_wgmma] [--per_step_elements 16384]

--per_step_elements: weight elements one thread's warpgroup decodes per loop iteration (block_n x
block_k for the decode kernel: 64 x 256 = 16384 at the dumped shape), to print instructions per element
(per thread: / 128).
"""

from __future__ import annotations

import argparse
import re
import sys
import tarfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from triton_sass import count_sass  # noqa: E402

WARPGROUP_THREADS = 128


def listings(source: str) -> dict[str, str]:
    """{file name: text} of every dumped file in a directory or a .tgz that holds SASS lines."""
    texts = {}
    if source.endswith((".tgz", ".tar.gz")):
        with tarfile.open(source) as tar:
            for member in tar.getmembers():
                if member.isfile():
                    texts[member.name] = tar.extractfile(member).read().decode(errors="replace")
    else:
        texts = {str(p): p.read_text(errors="replace") for p in Path(source).rglob("*") if p.is_file()}
    return {name: text for name, text in texts.items() if re.search(r"/\*[0-9a-f]{4}\*/", text)}


def kernels(text: str) -> dict[str, str]:
    """Split a listing into its functions (cuobjdump's `Function : NAME` headers; one unnamed
    function otherwise)."""
    parts = re.split(r"^\s*Function\s*:\s*(\S+)\s*$", text, flags=re.M)
    if len(parts) == 1:
        return {"": text}
    return {parts[i]: parts[i + 1] for i in range(1, len(parts) - 1, 2)}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("source", help="MOSAIC_GPU_DUMP_TO's directory, or a .tgz of it")
    parser.add_argument("--kernel", default="", help="only kernels (or files) whose name contains this")
    parser.add_argument("--per_step_elements", type=int, default=0,
                        help="weight elements a warpgroup decodes per loop iteration: prints instructions per element")
    args = parser.parse_args(argv)
    found = listings(args.source)
    if not found:
        raise SystemExit(f"no SASS listing under {args.source} (was the run made with MOSAIC_GPU_DUMP_SASS=1 and "
                         "MOSAIC_GPU_DUMP_TO=DIR?)")
    shown = 0
    for name, text in sorted(found.items()):
        for function, sass in kernels(text).items():
            if args.kernel and args.kernel not in function and args.kernel not in name:
                continue
            counts = count_sass(sass)
            line = f"{name} {function}: {counts['sass_total']} instructions, loop body {counts['loop_body']}"
            if args.per_step_elements and counts["loop_body"]:
                per_thread = args.per_step_elements / WARPGROUP_THREADS
                line += f" ({counts['loop_body'] / per_thread:.1f} per weight element per thread)"
            print(line)
            print(f"  loop: {counts['loop_top']}")
            print(f"  all:  {counts['top']}")
            shown += 1
    if not shown:
        raise SystemExit(f"no kernel matching {args.kernel!r} among {sorted(found)}")


if __name__ == "__main__":
    main()
