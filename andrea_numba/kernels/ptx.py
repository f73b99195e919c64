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
import numpy as np

from .common import SIMULATOR

if not SIMULATOR:
    from llvmlite import ir
    from numba import types
    from numba.cuda.extending import intrinsic

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
        to the tensor core this value is tf32_round(x) (bench/tf32_check.py checks that on the
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

else:
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
        with np.errstate(over="ignore"):
            h = np.array([lo, hi], np.float32).astype(np.float16).view(np.uint16).astype(np.uint32)
        return np.int32(np.uint32(h[0] | (h[1] << np.uint32(16))).view(np.int32))

    def bf16x2(lo, hi):
        """Simulator twin of cvt.rn.bf16x2.f32: the two bf16 bit patterns (ties to even), lo in
        the low half of an int32."""
        from reference.precision import round_bf16
        bits = round_bf16(np.array([lo, hi], np.float32)).view(np.uint32) >> np.uint32(16)
        return np.int32(np.uint32(bits[0] | (bits[1] << np.uint32(16))).view(np.int32))

    def load4(arr, index):
        flat = arr.reshape(-1)
        return flat[index], flat[index + 1], flat[index + 2], flat[index + 3]

    def store4(arr, index, v0, v1, v2, v3):
        flat = arr.reshape(-1)
        flat[index], flat[index + 1], flat[index + 2], flat[index + 3] = v0, v1, v2, v3
