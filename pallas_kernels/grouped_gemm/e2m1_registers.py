"""E2M1 codes to f16 in registers with 32-bit instructions (Mosaic GPU, lane semantics).

The decode kernel's `decode="bits"` moves each code's bits with 16-bit integer operations, one
element at a time (sm_90 has no two-lane 16-bit shifts). Here each output register, an f16 pair,
comes from the 32-bit word its two codes were loaded in, with five instructions:

    prmt.b32 t, w, w >> 4, 0xF{p+4}F{p}   # byte p's low nibble -> bits 0..3, its high nibble -> bits 16..19
    and.b32  t, t, 0x000F000F
    shl.b32  a, t, 9                      # the magnitude bits m2 m1 m0 -> f16 bits 11..9 (and 27..25)
    shl.b32  b, t, 12                     # the sign -> f16 bit 15 (and 31)
    lop3.b32 f, a, b, 0x8E008E00, 0xA8    # f = (a | b) & 0x8E008E00

which is `codes_times_2_pow_minus_14` of both codes: sign at bit 15, magnitude at bits [11:9],
dec(q) 2^-14 as an f16 (the shift by 4 is shared by a word's four pairs after LLVM's CSE). It is the same tile as
the "bits" decode, bit for bit; `pair_reference` is its Python model (tested against the "bits"
decode for every byte). The pairing follows Mosaic's own int4 -> bf16 conversion: after the relayout
from `WGMMA_UPCAST_4X` a register of the WGMMA layout is a 2-code slice of a 32-bit word, its
even element in the low nibble of byte p.

`plgpu.inline_mgpu` lowers in lane semantics only, and the Mosaic GPU interpreter does not run
it: the kernels that use it run compiled (`wgmma_nvfp4`'s `decode="asm"`, tested with `-m gpu`)
and their lowering for sm_90 is checked on CPU.
"""

from __future__ import annotations

import numpy as np

PAIR_MASK = 0x8E008E00
LOP3_OR_AND = 0xA8  # (a | b) & c over lop3's operand truth tables a=0xF0, b=0xCC, c=0xAA


def pair_asm(part: int) -> str:
    """The PTX that decodes the codes of byte `part` (0..3) of $1 ($2 = $1 >> 4) into $0."""
    if part not in range(4):
        raise ValueError(f"part={part} must be a byte index 0..3")
    return f"""
    {{
    .reg .b32 t, a, b;
    prmt.b32 t, $1, $2, 0xF{part + 4}F{part};
    and.b32 t, t, 0x000F000F;
    shl.b32 a, t, 9;
    shl.b32 b, t, 12;
    lop3.b32 $0, a, b, {PAIR_MASK:#010x}, {LOP3_OR_AND:#04x};
    }}
    """


def _prmt(a: int, b: int, selector: int) -> int:
    """PTX prmt.b32 (default mode): byte i of the result is byte (selector nibble i & 7) of
    {b, a} (0-3: a, 4-7: b), replicated from its sign bit when the nibble's bit 3 is set."""
    source = (a & 0xFFFFFFFF) | ((b & 0xFFFFFFFF) << 32)
    out = 0
    for i in range(4):
        nibble = (selector >> (4 * i)) & 0xF
        byte = (source >> (8 * (nibble & 7))) & 0xFF
        if nibble & 8:
            byte = 0xFF if byte & 0x80 else 0x00
        out |= byte << (8 * i)
    return out


def pair_reference(word: int, part: int) -> tuple[int, int]:
    """A Python model of `pair_asm(part)` on a 32-bit word: the (low, high) f16 bit patterns."""
    t = _prmt(word, word >> 4, int(f"F{part + 4}F{part}", 16)) & 0x000F000F
    a, b = (t << 9) & 0xFFFFFFFF, (t << 12) & 0xFFFFFFFF
    f = (a | b) & PAIR_MASK
    return f & 0xFFFF, f >> 16


def decode_registers(codes):
    """In an `inline_mgpu` body: an int4 FragmentedArray in the WGMMA layout (2-code registers) ->
    the f16 FragmentedArray of dec(q) 2^-14, by `pair_asm`."""
    from jax._src.lib.mlir import ir
    from jax._src.lib.mlir.dialects import arith, llvm, vector
    from jax.experimental.mosaic import gpu as mgpu
    from jax.experimental.mosaic.gpu import utils

    i32 = ir.IntegerType.get_signless(32)
    pair_type = ir.VectorType.get((2,), ir.F16Type.get())
    out = np.empty_like(codes.registers)
    for idx, reg in np.ndenumerate(codes.registers):
        slice_op = getattr(reg.owner, "opview", None)
        if not (isinstance(slice_op, vector.ExtractStridedSliceOp) and utils.bitwidth(slice_op.source.type) == 32):
            raise ValueError(f"decode_registers: register {idx} is not a 2-code slice of a 32-bit word (the relayout "
                             "from WGMMA_UPCAST_4X gives only such registers); no pair_asm byte to take")
        word, part = utils.bitcast(slice_op.source, i32), slice_op.offsets[0].value // 2
        # the same word's bitcast and shift, emitted per pair, are one each after LLVM's CSE
        pair = llvm.inline_asm(i32, [word, arith.shrui(word, utils.c(4, i32))], pair_asm(part), "=r,r,r")
        out[idx] = utils.bitcast(pair, pair_type)
    return mgpu.FragmentedArray(_registers=out, _layout=codes.layout, _is_signed=None)


def load_and_decode(codes_smem, shape: tuple[int, int]):
    """In a lane-semantics Mosaic GPU kernel: a tile's int4 codes [r, c] in shared memory -> f16
    [r, c] dec(q) 2^-14 in the WGMMA layout, loaded 8 codes per 32-bit load (`WGMMA_UPCAST_4X`),
    moved into the WGMMA layout while 4-bit, decoded by `pair_asm`."""
    import jax.numpy as jnp
    from jax.experimental.mosaic import gpu as mgpu
    from jax.experimental.pallas import mosaic_gpu as plgpu

    @plgpu.inline_mgpu(arg_types=(plgpu.RefType(),),
                       return_type=plgpu.ShapeDtypeStruct(shape, jnp.float16, layout=plgpu.Layout.WGMMA))
    def decode(_, ref):
        codes = mgpu.FragmentedArray.load_untiled(ref, layout=mgpu.WGMMA_LAYOUT_UPCAST_4X, is_signed=True,
                                                  optimized=False)
        return decode_registers(codes.to_layout(mgpu.WGMMA_LAYOUT))

    return decode(codes_smem)


__all__ = ["LOP3_OR_AND", "PAIR_MASK", "decode_registers", "load_and_decode", "pair_asm", "pair_reference"]
