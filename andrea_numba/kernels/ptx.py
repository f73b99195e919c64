"""One-instruction device functions that Numba does not offer, for the fast product kernels.

Numba compiles Python to LLVM IR, which the NVPTX backend turns into PTX. A few instructions have
no Python spelling: the tensor-core matrix product `mma.sync`, the TF32 rounding `cvt.rna.tf32` and
the bf16 rounding and packing `cvt.rn.bf16x2.f32`.
numba-cuda lets a package add them as `@intrinsic` functions whose code generator writes the LLVM
IR by hand, here an inline-assembly call of exactly one PTX instruction (numba-cuda's own
`cache_hints` module does the same for cached loads). The 128-bit loads and stores are one LLVM
vector access each (`load <4 x float>`, align 16), which the backend emits as `ld.v4.f32` /
`st.v4.f32`; no assembly is needed for them.

The CUDA simulator runs kernels as Python and cannot run PTX. Each function below that a kernel
calls in the simulator has a plain Python twin with the same meaning (chosen at import time). The
tensor-core product `mma_tf32` has no per-thread twin: one instruction mixes the registers of 32
threads. Kernels that use it (matmul v4, flash attention v2) are built with a NumPy twin of the
8-deep product in the simulator instead: the same tiles and the same per-thread outputs
(kernels/warp_tile.py).

Fragment layout of mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 (PTX ISA, "Matrix fragments
for mma.m16n8k8"), one warp, lane = 4 g + t (g = lane >> 2 in 0..7, t = lane & 3 in 0..3):

    A (16 x 8, row major):   a0 = A[g, t]     a1 = A[g + 8, t]     a2 = A[g, t + 4]     a3 = A[g + 8, t + 4]
    B (8 x 8, "col"):        b0 = B[t, g]     b1 = B[t + 4, g]
    C, D (16 x 8):           c0 = C[g, 2t]    c1 = C[g, 2t + 1]    c2 = C[g + 8, 2t]    c3 = C[g + 8, 2t + 1]

    D = A @ B + C, with A and B read as TF32 (1 sign, 8 exponent, 10 mantissa bits), products and
    sums in fp32.

Fragment layout of mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 (PTX ISA, "Matrix
fragments for mma.m16n8k16 with floating point type"): each .b32 register holds two bf16 values,
the lower k in the low half (bf16x2 packs them), same g and t:

    A (16 x 16):   a0 = A[g, 2t:2t+2]       a1 = A[g + 8, 2t:2t+2]
                   a2 = A[g, 2t+8:2t+10]    a3 = A[g + 8, 2t+8:2t+10]
    B (16 x 8):    b0 = B[2t:2t+2, g]       b1 = B[2t+8:2t+10, g]
    C, D (16 x 8): as for m16n8k8

    D = A @ B + C: sixteen values of k a row in one instruction, every product of two bf16 exact,
    sums in fp32.
"""
import threading

import numpy as np
from numba import cuda

from .common import SIMULATOR

if SIMULATOR:
    from .common import sim_meet

if not SIMULATOR:      # the intrinsics' code generators (the simulator runs the twins below instead)
    from llvmlite import ir
    from numba import types
    from numba.cuda import cgutils
    from numba.cuda.extending import intrinsic

FULL = 0xFFFFFFFF              # every lane of the warp takes part in a shuffle

# The simulator's stand-ins for the GPU's conversions to bf16 and fp16 (cvt.rn.bf16x2.f32,
# cvt.rn.f16x2.f32), written apart from the twin's rounding (reference/precision.py adds to the bits,
# and takes NumPy's float16) so that the two cannot share a bug: each value is put on its binade's grid
# of 2^M steps in float64, where the division by a power of two is exact and np.rint rounds halfway
# values to the even step; past the largest finite value, infinity (tests/test_rounding.py checks both
# against tables of every value of the formats).
def _round_to_grid(x, mantissa_bits: int, min_exponent: int, max_value: float):
    v = np.asarray(x, dtype=np.float32).astype(np.float64)
    finite = np.isfinite(v)
    a = np.where(finite, np.abs(v), 1.0)
    _, k = np.frexp(np.where(a > 0, a, 1.0))          # a = m 2^k, 0.5 <= m < 1: the binade 2^(k-1)
    step = np.ldexp(1.0, np.maximum(k - 1, min_exponent) - mantissa_bits)
    r = np.rint(a / step) * step
    r = np.where(r > max_value, np.inf, r)
    return np.where(finite, np.copysign(r, v), v).astype(np.float32)


def sim_round_bf16(x):
    """x rounded to bf16 (8 significant bits, smallest normal 2^-126), ties to even, as float32."""
    return _round_to_grid(x, 7, -126, float.fromhex("0x1.fep127"))


def sim_round_fp16(x):
    """x rounded to fp16 (11 significant bits, smallest normal 2^-14, largest 65504), ties to even."""
    return _round_to_grid(x, 10, -14, 65504.0)


if not SIMULATOR:
    _f32, _i32 = ir.FloatType(), ir.IntType(32)
    _F4 = types.UniTuple(types.float32, 4)

    @intrinsic
    def tf32_round_cvt(typingctx, x):
        """x rounded to the nearest TF32 value (ties away from zero), returned as a float32 whose
        low 13 mantissa bits are zero.   PTX: cvt.rna.tf32.f32 %r, %f;"""
        if x != types.float32:
            return None

        def codegen(context, builder, sig, args):
            asm = ir.InlineAsm(ir.FunctionType(_i32, [_f32]), "cvt.rna.tf32.f32 $0, $1;", "=r,f")
            return builder.bitcast(builder.call(asm, [args[0]]), _f32)
        return types.float32(types.float32), codegen

    @intrinsic
    def tf32_round(typingctx, x):
        """The same rounding as tf32_round_cvt, on the bit pattern: add half a TF32 unit (0x1000,
        bit 12) to the magnitude bits, then clear the low 13 bits (a carry into the exponent is the
        right rounding). Two integer instructions, no conversion unit.   PTX: add.s32, and.b32
        (the kernels use this form; bit for bit the same as cvt.rna for every finite float)."""
        if x != types.float32:
            return None

        def codegen(context, builder, sig, args):
            b = builder.add(builder.bitcast(args[0], _i32), ir.Constant(_i32, 0x1000))
            return builder.bitcast(builder.and_(b, ir.Constant(_i32, -0x2000)), _f32)   # -0x2000 = 0xFFFFE000
        return types.float32(types.float32), codegen

    @intrinsic
    def tf32_half_up(typingctx, x):
        """x's bit pattern plus half a TF32 unit (0x1000), the low 13 bits left as they are: the
        first half of tf32_round. An mma.sync reads a TF32 operand from its top 19 bits only, so
        to the tensor core this value is tf32_round(x) (lab/bench/tf32_check.py checks that on the
        GPU, bit for bit), one instruction cheaper. Not a float to compute with.   PTX: add.s32"""
        if x != types.float32:
            return None

        def codegen(context, builder, sig, args):
            return builder.bitcast(builder.add(builder.bitcast(args[0], _i32), ir.Constant(_i32, 0x1000)), _f32)
        return types.float32(types.float32), codegen

    @intrinsic
    def mma_tf32(typingctx, a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
        """(d0, d1, d2, d3) = one warp's 16x8 tile of A @ B + C, A 16 x 8 and B 8 x 8 in TF32
        (fragment layout in the module docstring). Every lane of the warp must call it together.
        PTX: mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {d0..d3}, {a0..a3}, {b0, b1}, {c0..c3};"""
        sig = _F4(*([types.float32] * 10))

        def codegen(context, builder, sig, args):
            out = ir.LiteralStructType([_f32] * 4)
            asm = ir.InlineAsm(ir.FunctionType(out, [_i32] * 6 + [_f32] * 4),
                               "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
                               "{$0, $1, $2, $3}, {$4, $5, $6, $7}, {$8, $9}, {$10, $11, $12, $13};",
                               "=f,=f,=f,=f,r,r,r,r,r,r,f,f,f,f")
            ab = [builder.bitcast(v, _i32) for v in args[:6]]     # A and B travel as .b32 registers
            d = builder.call(asm, ab + list(args[6:]))
            return context.make_tuple(builder, _F4, [builder.extract_value(d, i) for i in range(4)])
        return sig, codegen

    def _pack16(kind):
        """cvt.rn.<kind>x2.f32: two float32 rounded to a 16-bit format and packed in one register."""
        ptx = f"cvt.rn.{kind}x2.f32 $0, $1, $2;"

        def typer(typingctx, lo, hi):
            if lo != types.float32 or hi != types.float32:
                return None

            def codegen(context, builder, sig, args):
                asm = ir.InlineAsm(ir.FunctionType(_i32, [_f32, _f32]), ptx, "=r,f,f")
                return builder.call(asm, [args[1], args[0]])       # the first source goes to the upper half
            return types.int32(types.float32, types.float32), codegen
        return typer

    @intrinsic
    def bf16x2(typingctx, lo, hi):
        """lo and hi rounded to the nearest bfloat16 (ties to even) and packed in one 32-bit
        register, lo in the low half: the form an mma.sync takes two bf16 operands in.
        PTX: cvt.rn.bf16x2.f32 %r, %hi, %lo;   (the first source goes to the upper half)"""
        return _pack16("bf16")(typingctx, lo, hi)

    @intrinsic
    def bf16_value(typingctx, x):
        """x rounded to the nearest bfloat16 (ties to even), as the float32 of the same value: the
        bf16 in the upper half of a 32-bit register, zeros below (what a product that rounds its
        inputs multiplies, kept in fp32 registers).   PTX: cvt.rn.bf16x2.f32 %r, %x, 0f00000000;"""
        if x != types.float32:
            return None

        def codegen(context, builder, sig, args):
            asm = ir.InlineAsm(ir.FunctionType(_i32, [_f32, _f32]), "cvt.rn.bf16x2.f32 $0, $1, $2;", "=r,f,f")
            return builder.bitcast(builder.call(asm, [args[0], ir.Constant(_f32, 0.0)]), _f32)
        return types.float32(types.float32), codegen

    @intrinsic
    def f16x2(typingctx, lo, hi):
        """lo and hi rounded to the nearest fp16 (ties to even; past 65504: inf) and packed in one
        32-bit register, lo in the low half.   PTX: cvt.rn.f16x2.f32 %r, %hi, %lo;"""
        return _pack16("f16")(typingctx, lo, hi)

    def _mma16(kind):
        """An m16n8k16 mma.sync of two 16-bit formats (bf16 or f16), fp32 sums."""
        ptx = (f"mma.sync.aligned.m16n8k16.row.col.f32.{kind}.{kind}.f32 "
               "{$0, $1, $2, $3}, {$4, $5, $6, $7}, {$8, $9}, {$10, $11, $12, $13};")

        def typer(typingctx, a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
            sig = _F4(*([types.int32] * 6 + [types.float32] * 4))

            def codegen(context, builder, sig, args):
                out = ir.LiteralStructType([_f32] * 4)
                asm = ir.InlineAsm(ir.FunctionType(out, [_i32] * 6 + [_f32] * 4), ptx, "=f,=f,=f,=f,r,r,r,r,r,r,f,f,f,f")
                ab = [context.cast(builder, v, t, types.int32) for v, t in zip(args[:6], sig.args[:6])]
                c = [context.cast(builder, v, t, types.float32) for v, t in zip(args[6:], sig.args[6:])]
                d = builder.call(asm, ab + c)
                return context.make_tuple(builder, _F4, [builder.extract_value(d, i) for i in range(4)])
            return sig, codegen
        return typer

    @intrinsic
    def mma_f16(typingctx, a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
        """mma_bf16 for fp16 operands (two to a register, f16x2), products exact, sums in fp32.
        PTX: mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {d0..d3}, {a0..a3}, {b0, b1}, {c0..c3};"""
        return _mma16("f16")(typingctx, a0, a1, a2, a3, b0, b1, c0, c1, c2, c3)

    @intrinsic
    def mma_bf16(typingctx, a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
        """(d0, d1, d2, d3) = one warp's 16x8 tile of A @ B + C, A 16 x 16 and B 16 x 8 in bf16, two
        values to a register (bf16x2), products exact, sums in fp32 (fragment layout in the
        module docstring). Every lane of the warp must call it together.
        PTX: mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {d0..d3}, {a0..a3}, {b0, b1}, {c0..c3};"""
        return _mma16("bf16")(typingctx, a0, a1, a2, a3, b0, b1, c0, c1, c2, c3)

    def _element_pointer(context, builder, arrty, arr, index, indexty):
        """Address of element `index` of a C-contiguous array, counted in elements from its start."""
        data = context.make_array(arrty)(context, builder, arr).data
        idx = context.cast(builder, index, indexty, types.intp)
        return builder.gep(data, [idx])

    @intrinsic
    def load4(typingctx, arr, index):
        """(arr.flat[index], ..., arr.flat[index + 3]): one 128-bit load. arr is a C-contiguous
        float32 array and its element `index` lies on a 16-byte boundary.   PTX: ld.v4.f32"""
        if not (isinstance(arr, types.Array) and arr.dtype == types.float32 and isinstance(index, types.Integer)):
            return None

        def codegen(context, builder, sig, args):
            ptr = _element_pointer(context, builder, sig.args[0], args[0], args[1], sig.args[1])
            vec = builder.load(builder.bitcast(ptr, ir.VectorType(_f32, 4).as_pointer()), align=16)
            return context.make_tuple(builder, _F4, [builder.extract_element(vec, ir.Constant(_i32, i))
                                                     for i in range(4)])
        return _F4(arr, index), codegen

    @intrinsic
    def store4(typingctx, arr, index, v0, v1, v2, v3):
        """arr.flat[index .. index + 3] = v0, v1, v2, v3: one 128-bit store (same rules as load4).
        PTX: st.v4.f32"""
        if not (isinstance(arr, types.Array) and arr.dtype == types.float32 and isinstance(index, types.Integer)):
            return None

        def codegen(context, builder, sig, args):
            ptr = _element_pointer(context, builder, sig.args[0], args[0], args[1], sig.args[1])
            vec = ir.Constant(ir.VectorType(_f32, 4), ir.Undefined)
            for i in range(4):
                val = context.cast(builder, args[2 + i], sig.args[2 + i], types.float32)
                vec = builder.insert_element(vec, val, ir.Constant(_i32, i))
            builder.store(vec, builder.bitcast(ptr, ir.VectorType(_f32, 4).as_pointer()), align=16)
            return context.get_dummy_value()
        return types.void(arr, index, v0, v1, v2, v3), codegen

    # ldmatrix and the 64-bit shared store of bf16 pairs (matmul v12, kernels/half_tile.py). ldmatrix
    # reads 8 x 8 matrices of 16-bit values from shared memory for the whole warp at once: lane
    # 8 i + j (j = 0..7) gives the shared address of row j of matrix i (16 contiguous, 16-byte
    # aligned bytes: 8 values), and every lane receives, for each matrix i, one 32-bit register:
    #
    #     ldmatrix.sync.aligned.m8n8.x4.shared.b16        r_i = (M_i[g, 2t], M_i[g, 2t + 1])
    #     ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16  r_i = (M_i[2t, g], M_i[2t + 1, g])
    #
    # (lane = 4 g + t; the first value in the low half.) That is the A, B fragment layout of
    # mma.m16n8k16 above: four matrices are the four registers a0..a3 of a 16 x 16 A fragment,
    # or b0, b1 of two 16 x 8 B fragments. .trans reads a matrix stored the other way round
    # (rows k instead of rows m or n) and hands each lane the same pairs.
    _I4 = types.UniTuple(types.int32, 4)

    def _word_array(arr, index):
        """An array of 32-bit words (int32, or float32 holding bit patterns) and an integer index."""
        return (isinstance(arr, types.Array) and arr.dtype in (types.int32, types.float32)
                and isinstance(index, types.Integer))

    def _shared_address(context, builder, arrty, arr, index, indexty):
        """The 32-bit shared-window address of element `index` of a shared array (any dtype: index
        times its size in bytes): Numba keeps a shared array's data as a generic pointer;
        addrspacecast to the shared space (3) and ptrtoint give the .u32 address that ld/st/ldmatrix
        .shared and wgmma's descriptors take (cvta.to.shared, which the compiler drops when it sees
        the array is shared), plus the index's bytes."""
        data = builder.bitcast(context.make_array(arrty)(context, builder, arr).data, ir.PointerType(ir.IntType(8)))
        base = builder.ptrtoint(builder.addrspacecast(data, ir.PointerType(ir.IntType(8), 3)), _i32)
        size = context.get_abi_sizeof(context.get_data_type(arrty.dtype))
        idx = builder.trunc(context.cast(builder, index, indexty, types.intp), _i32)   # 32-bit arithmetic:
        return builder.add(base, builder.mul(idx, ir.Constant(_i32, size)))          # shared memory is < 4 GiB

    def _ldmatrix(trans):
        ptx = ("ldmatrix.sync.aligned.m8n8.x4" + (".trans" if trans else "") +
               ".shared.b16 {$0, $1, $2, $3}, [$4];")

        def typer(typingctx, arr, index):
            if not _word_array(arr, index):
                return None

            def codegen(context, builder, sig, args):
                addr = _shared_address(context, builder, sig.args[0], args[0], args[1], sig.args[1])
                out = ir.LiteralStructType([_i32] * 4)
                # side_effect: it reads what other threads stored; keep it where the barrier put it
                asm = ir.InlineAsm(ir.FunctionType(out, [_i32]), ptx, "=r,=r,=r,=r,r", side_effect=True)
                d = builder.call(asm, [addr])
                return context.make_tuple(builder, _I4, [builder.extract_value(d, i) for i in range(4)])
            return _I4(arr, index), codegen
        return typer

    @intrinsic
    def ldmatrix_x4(typingctx, arr, index):
        """(r0, r1, r2, r3): four 8 x 8 matrices of bf16 (or fp16) from the shared array arr, this
        lane giving the address of element `index` (a 16-byte aligned row of 8 values: row
        lane % 8 of matrix lane // 8); lane 4 g + t receives r_i = (M_i[g, 2t], M_i[g, 2t + 1]),
        two values a register, the first in the low half (layout in the comment above). Every lane
        of the warp must call it together.
        PTX: ldmatrix.sync.aligned.m8n8.x4.shared.b16 {r0, r1, r2, r3}, [addr];"""
        return _ldmatrix(False)(typingctx, arr, index)

    @intrinsic
    def ldmatrix_x4_trans(typingctx, arr, index):
        """ldmatrix_x4 of the transposed matrices: the rows given are M_i's rows, and lane 4 g + t
        receives r_i = (M_i[2t, g], M_i[2t + 1, g]), the first in the low half.
        PTX: ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {r0, r1, r2, r3}, [addr];"""
        return _ldmatrix(True)(typingctx, arr, index)

    @intrinsic
    def store2(typingctx, arr, index, w0, w1):
        """arr[index], arr[index + 1] = the bits of the int32 words w0, w1: one 64-bit store to the
        shared array arr (int32, or float32 holding bit patterns; element `index` on an 8-byte
        boundary), its address in 32-bit arithmetic as ldmatrix's.
        PTX: st.shared.v2.b32 [addr], {w0, w1};"""
        if not _word_array(arr, index):
            return None

        def codegen(context, builder, sig, args):
            addr = _shared_address(context, builder, sig.args[0], args[0], args[1], sig.args[1])
            w = [context.cast(builder, v, t, types.int32) for v, t in zip(args[2:], sig.args[2:])]
            asm = ir.InlineAsm(ir.FunctionType(ir.VoidType(), [_i32] * 3), "st.shared.v2.b32 [$0], {$1, $2};",
                               "r,r,r,~{memory}", side_effect=True)
            builder.call(asm, [addr] + w)
            return context.get_dummy_value()
        return types.void(arr, index, w0, w1), codegen


    # cp.async (matmul v13, kernels/half_tile.py): a copy global -> shared that no register sees.
    #
    #     cp.async.cg.shared.global [dst], [src], 16;
    #
    # starts copying 16 bytes from global address src (16-byte aligned) to shared address dst
    # (16-byte aligned) and returns at once: the thread goes on issuing instructions (the next
    # stage's copies, the current stage's mma.sync) while the bytes travel. .cg caches them in L2
    # only (not L1: each value reaches a block's shared memory once, so L1 would only be polluted);
    # .cg allows exactly 16 bytes. The copies a thread issued since its last commit form a group:
    #
    #     cp.async.commit_group;        closes the group (an empty group is allowed and counts)
    #     cp.async.wait_group N;        waits until at most N of this thread's groups are still
    #                                   pending: every older group's bytes are in shared memory
    #
    # N is an immediate (a constant in the instruction), hence one function per N below. The wait
    # only covers this thread's own copies: a barrier after it makes every thread's copies visible
    # to the block. The "memory" clobber keeps the compiler from moving shared loads and stores
    # across these instructions.
    @intrinsic
    def cp_async16(typingctx, sarr, sindex, garr, gindex):
        """Start copying 8 bf16 (16 bytes) from garr.flat[gindex ..] (a C-contiguous uint16 array in
        global memory, that element 16-byte aligned) to the 32-bit words sarr[sindex .. sindex + 3]
        of a shared array (sindex a multiple of 4); completed by commit_group and wait_group.
        PTX: cp.async.cg.shared.global [dst], [src], 16;"""
        if not (_word_array(sarr, sindex) and isinstance(garr, types.Array) and garr.dtype == types.uint16
                and isinstance(gindex, types.Integer)):
            return None

        def codegen(context, builder, sig, args):
            dst = _shared_address(context, builder, sig.args[0], args[0], args[1], sig.args[1])
            src = _element_pointer(context, builder, sig.args[2], args[2], args[3], sig.args[3])
            src = builder.bitcast(src, ir.PointerType(ir.IntType(8)))                 # generic -> global (1):
            src = builder.ptrtoint(builder.addrspacecast(src, ir.PointerType(ir.IntType(8), 1)), ir.IntType(64))
            asm = ir.InlineAsm(ir.FunctionType(ir.VoidType(), [_i32, ir.IntType(64)]),   # cvta.to.global
                               "cp.async.cg.shared.global [$0], [$1], 16;", "r,l,~{memory}", side_effect=True)
            builder.call(asm, [dst, src])
            return context.get_dummy_value()
        return types.void(sarr, sindex, garr, gindex), codegen

    def _no_operand(ptx):
        """An instruction without operands, kept in place (side effect, memory clobber)."""
        def typer(typingctx):
            def codegen(context, builder, sig, args):
                builder.call(ir.InlineAsm(ir.FunctionType(ir.VoidType(), []), ptx, "~{memory}", side_effect=True), [])
                return context.get_dummy_value()
            return types.void(), codegen
        return typer

    @intrinsic
    def cp_async_commit(typingctx):
        """Close this thread's group of cp.async copies issued since the last commit.
        PTX: cp.async.commit_group;"""
        return _no_operand("cp.async.commit_group;")(typingctx)

    @intrinsic
    def cp_async_wait_0(typingctx):
        """Wait until all of this thread's cp.async groups have landed.   PTX: cp.async.wait_group 0;"""
        return _no_operand("cp.async.wait_group 0;")(typingctx)

    @intrinsic
    def cp_async_wait_1(typingctx):
        """Wait until at most the newest 1 of this thread's groups is pending.   PTX: cp.async.wait_group 1;"""
        return _no_operand("cp.async.wait_group 1;")(typingctx)

    @intrinsic
    def cp_async_wait_2(typingctx):
        """Wait until at most the newest 2 of this thread's groups are pending.   PTX: cp.async.wait_group 2;"""
        return _no_operand("cp.async.wait_group 2;")(typingctx)

    # The 16-bit operand copies (cublaslt.py, k_round_bf16 / k_round_fp16): four 32-bit values
    # from a row of a 2-D array whose rows may be strided (a view), and eight 16-bit values stored
    # at once. One LLVM vector access each, as load4 / store4.
    _WORD = (types.float32, types.int32, types.uint32)

    @intrinsic
    def load4_row(typingctx, arr, i, j):
        """(arr[i, j], arr[i, j + 1], arr[i, j + 2], arr[i, j + 3]): one 128-bit load. arr is a 2-D
        array of 32-bit values (float32, int32, uint32) in global memory (a kernel's argument) whose
        rows are contiguous, though they may lie any stride apart, and &arr[i, j] lies on a 16-byte
        boundary.   PTX: ld.global.v4.u32 (.f32)"""
        if not (isinstance(arr, types.Array) and arr.ndim == 2 and arr.dtype in _WORD
                and isinstance(i, types.Integer) and isinstance(j, types.Integer)):
            return None
        out = types.UniTuple(arr.dtype, 4)

        def codegen(context, builder, sig, args):
            aryty = sig.args[0]
            ary = context.make_array(aryty)(context, builder, args[0])
            inds = [context.cast(builder, v, t, types.intp) for v, t in zip(args[1:], sig.args[1:])]
            ptr = cgutils.get_item_pointer(context, builder, aryty, ary, inds)    # strides honoured
            vec_t = ir.VectorType(context.get_value_type(aryty.dtype), 4)
            # a strided array's address is integer arithmetic, which hides from the compiler that
            # it points into global memory (it would emit a generic ld.v4): say so (space 1)
            ptr = builder.addrspacecast(builder.bitcast(ptr, vec_t.as_pointer()), vec_t.as_pointer(1))
            vec = builder.load(ptr, align=16)
            return context.make_tuple(builder, out, [builder.extract_element(vec, ir.Constant(_i32, k))
                                                     for k in range(4)])
        return out(arr, i, j), codegen

    @intrinsic
    def store8(typingctx, arr, index, v0, v1, v2, v3, v4, v5, v6, v7):
        """arr[index .. index + 7] = v0 .. v7, each converted to arr's type (float32 -> float16:
        cvt.rn.f16.f32, an integer -> uint16: its low 16 bits): one 128-bit store of eight 16-bit
        values. arr is a 1-D uint16 or float16 array in global memory (a kernel's argument), its
        elements index .. index + 7 contiguous, element `index` on a 16-byte boundary.
        PTX: st.global.v4.u32 (the values packed two to a 32-bit register, the first low)"""
        vals = (v0, v1, v2, v3, v4, v5, v6, v7)
        if not (isinstance(arr, types.Array) and arr.ndim == 1 and arr.dtype in (types.uint16, types.float16)
                and isinstance(index, types.Integer) and all(isinstance(v, types.Number) for v in vals)):
            return None

        def codegen(context, builder, sig, args):
            aryty = sig.args[0]
            ary = context.make_array(aryty)(context, builder, args[0])
            ind = context.cast(builder, args[1], sig.args[1], types.intp)
            ptr = cgutils.get_item_pointer(context, builder, aryty, ary, [ind])
            half = []                                       # the eight values' 16 bits, as i32
            for k in range(8):
                val = context.cast(builder, args[2 + k], sig.args[2 + k], aryty.dtype)
                half.append(builder.zext(builder.bitcast(val, ir.IntType(16)), _i32))
            vec_t = ir.VectorType(_i32, 4)                  # packed two to a word, the first low:
            vec = ir.Constant(vec_t, ir.Undefined)          # <8 x i16> would store as two 64-bit halves
            for k in range(4):
                word = builder.or_(half[2 * k], builder.shl(half[2 * k + 1], ir.Constant(_i32, 16)))
                vec = builder.insert_element(vec, word, ir.Constant(_i32, k))
            ptr = builder.addrspacecast(builder.bitcast(ptr, vec_t.as_pointer()), vec_t.as_pointer(1))
            builder.store(vec, ptr, align=16)                # global memory (space 1), as load4_row
            return context.get_dummy_value()
        return types.void(arr, index, *vals), codegen

    @cuda.jit(device=True, inline="always")
    def warp_sum(x, first, top):
        """x summed over lanes of the warp by a butterfly: for m = top, top / 2, ..., first (powers
        of two, top at most 16), lane i adds the value of lane i ^ m. So the lanes that differ from
        lane i only in the bits first..top get their sum: (1, 16) every lane the warp's total,
        (f, 16) the lanes i, i ^ f, i ^ 2f, ... that agree in the bits below f, (1, L / 2) each
        run of L lanes. Both lanes of a pair add the same two numbers and fp32 addition commutes:
        every lane of a group gets the same bits, in an order fixed by the lane numbers.
        PTX: shfl.sync.bfly.b32 (one a step)"""
        m = top
        while m >= first:
            x += cuda.shfl_xor_sync(FULL, x, m)
            m //= 2
        return x

    @cuda.jit(device=True, inline="always")
    def warp_max(x, first, top):
        """The maximum over the same lanes as warp_sum's.   PTX: shfl.sync.bfly.b32 (one a step)"""
        m = top
        while m >= first:
            x = max(x, cuda.shfl_xor_sync(FULL, x, m))
            m //= 2
        return x

    @cuda.jit(device=True, inline="always")
    def warp_prefix(x):
        """x_0 + x_1 + ... + x_{i-1} at lane i (0 at lane 0; x finite), added one lane at a time in
        lane order: lane i takes every lane's x in turn (a broadcast shuffle from lane j) and adds
        those below its own. Every lane that has got as far as j holds the same bits, so lane i's
        sum plus x_i is lane i + 1's sum, bit for bit: the order of a serial cumsum, never going
        down where the x are >= 0. The shuffles do not wait for the adds.
        PTX: shfl.sync.idx (32, two a step for a 64-bit x)"""
        lane = cuda.laneid
        acc = x - x                                     # 0 in x's type
        for j in range(32):
            y = cuda.shfl_sync(FULL, x, j)
            if j < lane:
                acc += y
        return acc

else:
    def _warp_values(x):
        """Simulator: every lane's x of this thread's warp (warp_gather; fewer than 32 in the last
        warp of a block smaller than a whole number of warps), and this thread's lane."""
        me = threading.current_thread()                    # the simulated thread: its index, its block's shape
        (tx, ty, tz), (bx, by, bz) = me.threadIdx, me._manager._block_dim
        i, n = (tz * by + ty) * bx + tx, bx * by * bz
        w, lane = i // 32, i % 32
        return warp_gather(x, w, lane, min(32, n - 32 * w)), lane

    def _butterfly(x, first, top, op, absent):
        """Simulator twin of warp_sum and warp_max: the lanes of this thread's warp meet
        (sim_meet) and leave their values, then the GPU's butterfly runs on all 32 in NumPy, in
        x's type, a lane past the block's last thread holding `absent` (0 for a sum: x + 0 is x)."""
        v, lane = _warp_values(x)
        dtype = np.asarray(x).dtype
        v = np.concatenate([v.astype(dtype), np.full(32 - len(v), absent, dtype)])
        m = top
        while m >= first:
            v = op(v, v[np.arange(32) ^ m])
            m //= 2
        return v[lane]

    def warp_sum(x, first, top):
        return _butterfly(x, first, top, np.add, 0)

    def warp_max(x, first, top):
        dtype = np.asarray(x).dtype
        return _butterfly(x, first, top, np.maximum, np.iinfo(dtype).min if dtype.kind in "iu" else -np.inf)

    def warp_prefix(x):
        """Simulator twin of warp_prefix: the warp's values gathered (warp_gather), then the ones
        of the lanes below this thread's added one at a time, in x's type."""
        v, lane = _warp_values(x)
        acc = np.zeros((), np.asarray(x).dtype)[()]
        for j in range(lane):
            acc = acc + v[j]
        return acc

    def tf32_round(x):
        """Simulator twin of cvt.rna.tf32.f32: add half a TF32 unit to the magnitude bits, clear
        the low 13 mantissa bits (round to nearest, ties away from zero)."""
        bits = np.array(x, dtype=np.float32).view(np.uint32)
        return (((bits + np.uint32(0x1000)) & np.uint32(0xFFFFE000))).view(np.float32)[()]

    tf32_round_cvt = tf32_round
    tf32_half_up = tf32_round     # the simulator has no tensor core to drop the low bits: do it here

    def mma_tf32(*args):
        raise NotImplementedError("mma.sync needs a GPU: in the simulator the kernels use a NumPy twin of the step")

    mma_bf16 = mma_f16 = mma_tf32

    def f16x2(lo, hi):
        """Simulator twin of cvt.rn.f16x2.f32: the two fp16 bit patterns (ties to even, inf past
        65504), lo in the low half of an int32."""
        with np.errstate(over="ignore"):       # (sim_round_fp16's values are fp16's: the cast is exact)
            h = sim_round_fp16(np.array([lo, hi], np.float32)).astype(np.float16).view(np.uint16).astype(np.uint32)
        return np.int32(np.uint32(h[0] | (h[1] << np.uint32(16))).view(np.int32))

    def bf16_value(x):
        """Simulator twin of bf16_value: x rounded to bf16 (ties to even), as a float32."""
        return sim_round_bf16(np.float32(x))[()]

    def bf16x2(lo, hi):
        """Simulator twin of cvt.rn.bf16x2.f32: the two bf16 bit patterns (ties to even), lo in
        the low half of an int32."""
        bits = sim_round_bf16(np.array([lo, hi], np.float32)).view(np.uint32) >> np.uint32(16)
        return np.int32(np.uint32(bits[0] | (bits[1] << np.uint32(16))).view(np.int32))

    def load4(arr, index):
        flat = arr.reshape(-1)
        return flat[index], flat[index + 1], flat[index + 2], flat[index + 3]

    def store4(arr, index, v0, v1, v2, v3):
        flat = arr.reshape(-1)
        flat[index], flat[index + 1], flat[index + 2], flat[index + 3] = v0, v1, v2, v3


    def load4_row(arr, i, j):
        """Simulator twin of the 128-bit row load; checks the 16-byte alignment a GPU needs."""
        a = getattr(arr, "_ary", arr)
        assert a[i, j:j + 4].ctypes.data % 16 == 0, "a 128-bit load needs a 16-byte aligned address"
        return a[i, j], a[i, j + 1], a[i, j + 2], a[i, j + 3]

    def store8(arr, index, v0, v1, v2, v3, v4, v5, v6, v7):
        """Simulator twin of the 128-bit store of eight 16-bit values (converted as arr[k] = v is);
        checks the 16-byte alignment."""
        a = getattr(arr, "_ary", arr)
        assert a[index:index + 8].ctypes.data % 16 == 0, "a 128-bit store needs a 16-byte aligned address"
        with np.errstate(over="ignore"):                 # float32 past fp16's range: inf, silently
            for k, v in enumerate((v0, v1, v2, v3, v4, v5, v6, v7)):
                a[index + k] = v

    def ldmatrix_x4(arr, index):
        raise NotImplementedError("ldmatrix is a warp instruction: in the simulator the kernels use ldmatrix_warp")

    ldmatrix_x4_trans = ldmatrix_x4

    def store2(arr, index, w0, w1):
        """Simulator twin of the 64-bit store: the bits of two int32 words (arr may be float32)."""
        flat = arr.reshape(-1).view(np.int32)
        flat[index], flat[index + 1] = w0, w1

    # cp.async in the simulator: the copy done at once (a plain copy of 4 words), the group
    # instructions nothing. A simulated thread's copy is then in shared memory before the barrier
    # that follows the wait, as on the GPU; what the simulator cannot check is the asynchrony
    # itself (that the wait_group count covers the stage about to be read).
    def cp_async16(sarr, sindex, garr, gindex):
        """Simulator twin of cp.async.cg.shared.global ... 16: 8 uint16 of garr.flat[gindex ..] into
        the 4 words sarr[sindex ..] (sarr float32 or int32 holding bit patterns)."""
        src = getattr(garr, "_ary", garr).reshape(-1)
        assert gindex % 8 == 0 and sindex % 4 == 0, "cp.async copies 16-byte aligned chunks"
        sarr.reshape(-1).view(np.int32)[sindex:sindex + 4] = src[gindex:gindex + 8].view(np.int32)

    def cp_async_commit():
        pass

    cp_async_wait_0 = cp_async_wait_1 = cp_async_wait_2 = cp_async_commit

    # Warp twins for the simulator: what one instruction gives all 32 lanes, from every lane's
    # operands at once (lanes along the second-to-last axis; any leading axes are a batch).
    _LANE = np.arange(32)
    _G, _T = _LANE >> 2, _LANE & 3

    def ldmatrix_warp(words, index, trans=False):
        """ldmatrix_x4 (trans: ldmatrix_x4_trans) for the whole warp: words, a flat int32 view of the
        shared tile; index[..., 32], each lane's word index of its row (row lane % 8 of matrix
        lane // 8, 4 words = 8 bf16). Returns the lanes' registers [..., 32, 4]: r_i of lane 4 g + t
        = (M_i[g, 2t], M_i[g, 2t + 1]), or (M_i[2t, g], M_i[2t + 1, g]) with trans."""
        index = np.asarray(index)
        rows = words[index[..., None] + np.arange(4)]                    # [..., 32 rows, 4 words]
        rows = rows.reshape(*index.shape[:-1], 4, 8, 4)                  # [..., matrix i, row, word]
        if not trans:
            return np.moveaxis(rows[..., _G, _T], -2, -1)               # word t of row g: values 2t, 2t + 1
        half = rows.view(np.uint16)                                      # [..., i, row, value] (little-endian halves)
        half = half.reshape(*index.shape[:-1], 4, 8, 8)
        lo, hi = half[..., 2 * _T, _G], half[..., 2 * _T + 1, _G]       # [..., i, lane]
        reg = lo.astype(np.uint32) | (hi.astype(np.uint32) << np.uint32(16))
        return np.moveaxis(reg.view(np.int32), -2, -1)

    def _unpack(regs):
        """The two bf16 values of each int32 register as float32 [..., 2] (low half first)."""
        bits = np.asarray(regs).astype(np.int64) & 0xFFFFFFFF
        lo = ((bits & 0xFFFF) << 16).astype(np.uint32).view(np.float32)
        hi = (bits & 0xFFFF0000).astype(np.uint32).view(np.float32)
        return np.stack([lo, hi], axis=-1)

    # where lane (g, t)'s register i, half p sits in the fragment (ptx.py's docstring)
    _A_ROW = (_G[:, None, None] + 8 * (np.arange(4)[None, :, None] & 1)) + 0 * np.arange(2)
    _A_COL = 2 * _T[:, None, None] + 8 * (np.arange(4)[None, :, None] >> 1) + np.arange(2)
    _B_ROW = 2 * _T[:, None, None] + 8 * np.arange(2)[None, :, None] + np.arange(2)
    _B_COL = _G[:, None, None] + 0 * _B_ROW

    def mma_bf16_warp(a, b):
        """mma.sync m16n8k16 .bf16 for the whole warp, from zero: a[..., 32, 4] and b[..., 32, 2],
        the lanes' bf16x2 registers (A 16 x 16 and B 16 x 8 in the fragment layout of the module
        docstring); returns the lanes' d0..d3 [..., 32, 4] of D = A @ B (exact products, fp32 sums)."""
        av, bv = _unpack(a), _unpack(b)                                  # [..., 32, 4, 2], [..., 32, 2, 2]
        A = np.zeros(av.shape[:-3] + (16, 16), np.float32)
        B = np.zeros(bv.shape[:-3] + (16, 8), np.float32)
        A[..., _A_ROW, _A_COL] = av
        B[..., _B_ROW, _B_COL] = bv
        D = A @ B
        # d0 D[g, 2t], d1 D[g, 2t + 1], d2 D[g + 8, 2t], d3 D[g + 8, 2t + 1]
        return np.stack([D[..., _G, 2 * _T], D[..., _G, 2 * _T + 1], D[..., _G + 8, 2 * _T],
                         D[..., _G + 8, 2 * _T + 1]], axis=-1)

    class _WarpSlots:
        """One warp's meeting point in the simulator: a slot for each lane's values."""

        def __init__(self):
            self.slots = [None] * 32

    def warp_gather(x, w, lane, lanes=32):
        """Simulator only: every lane's x (a number or an array) for warp w of this block, stacked
        [lanes, ...]: the twin of an exchange of registers in a warp (shfl.sync, the A operand of an
        mma.sync from registers). Each lane leaves its x in its slot, waits for the warp's other
        lanes, reads them all, and waits again (so no lane refills its slot before the warp has read
        it). A real barrier of the warp's threads: warps of a block pass it independently. lanes:
        the warp's threads (fewer than 32 in the last warp of a block the simulator runs small)."""
        block = threading.current_thread()._manager        # the simulator's block, shared by its threads
        warps = block.__dict__.setdefault("_warp_slots", {})
        meet = warps.get(w) or warps.setdefault(w, _WarpSlots())
        meet.slots[lane] = np.array(x, copy=True)
        sim_meet(("warp", w), lanes)
        out = np.stack(meet.slots[:lanes])
        sim_meet(("warp", w), lanes)
        return out


# cp.async.wait_group N by N (the ring of matmul v13 waits with N = STAGES - 2, then N = 0)
CP_ASYNC_WAIT = {0: cp_async_wait_0, 1: cp_async_wait_1, 2: cp_async_wait_2}
