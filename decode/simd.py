"""512-bit integer vectors for numba: the few LLVM operations the integer kernels need, and the CPU check.

numba has no vector type and LLVM does not turn plain loops into AVX-512 VNNI's ``vpdpbusd``
(four unsigned-byte x signed-byte products added into each 32-bit lane), so this module
declares a numba type ``I32x16`` for LLVM's ``<16 x i32>`` and intrinsics on it:

=================================  ===========================================================
``vload(a, i)``                    64 bytes of C-contiguous array ``a`` from element ``i``
``vbcast4(a, i)``                  the 4 bytes of ``a`` at element ``i`` as an int32, in every lane
``vsplat(v)``                      the int32 ``v`` in every lane
``vand(a, b)``, ``vsrl4(a)``       bitwise and; logical shift right of each lane by 4
``vdpbusd(acc, u, s)``             ``acc[l] + sum_k u8(u[l][k]) * i8(s[l][k])`` (exact, no saturation)
``vdpbusd_avx2``, ``_q8_avx2``     the same sums from AVX2's ``pmaddubsw`` + ``pmaddwd`` (Q4 codes;
                                   Q8_0's codes less 128)
``vstore(a, i, v)``                the 16 lanes into int32 array ``a`` from element ``i``
``vadd(a, b)``, ``vsub(a, b)``     lane-wise int32 sum and difference
``F32x16``: ``fsplat``, ``fadd``,  float32 vectors: splat, IEEE add and multiply (no fast-math
``fmul``, ``fload``, ``fstore``    flags, so never fused or reordered), load, store
``ffma(a, b, c)``                  ``a * b + c`` rounded once (for code that may fuse)
``vtofloat(a)``                    int32 lanes as float32
``fhalves(h, i)``                  16 f16 bit patterns of uint16 array ``h`` from ``i``, as float32
``half_bits(v)``                   a float32 rounded to a half (nearest, ties to even), as uint16 bits
``f32_bits(v)``, ``bits_f32(i)``   a float32's bit pattern as int32 and back (scalars)
``fhsum(v)``                       the 16 lanes of ``v`` added in one fixed order (a pairwise tree)
``fabsmax(v)``, ``vquant(v, inv)``  an activation block's largest ``|x|`` and its codes ``rint(x * inv)``
``vstore_i8(a, i, v)``, ``vhsum``  the codes stored as int8, and their int32 sum
=================================  ===========================================================

``vdpbusd`` compiles only for a CPU with AVX-512 VNNI: call it only when ``has_vnni()`` says so
(checked at load, from the features numba compiles for).  Everything else here is plain LLVM
vector code that any x86-64 target lowers.
"""

from __future__ import annotations

import numba
from llvmlite import binding as ll
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic, models, register_model

_I32 = ir.IntType(32)
_V16 = ir.VectorType(_I32, 16)
_F16 = ir.VectorType(ir.FloatType(), 16)


class VectorType(types.Type):
    """A 16-lane LLVM vector (``llty``) held in a numba variable (a zmm register, or two ymm, once compiled)."""

    def __init__(self, name: str, llty):
        self.llty = llty
        super().__init__(name=name)


@register_model(VectorType)
class _VectorModel(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, fe_type.llty)


#: ``<16 x i32>`` and ``<16 x float>``.
I32x16 = VectorType("I32x16", _V16)
F32x16 = VectorType("F32x16", _F16)


def _element_ptr(context, builder, arrty, arr, index):
    """Pointer to element ``index`` of a C-contiguous array value."""
    a = context.make_array(arrty)(context, builder, arr)
    return builder.gep(a.data, [index])


def _named(fn, name: str, doc: str):
    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = doc
    return intrinsic(fn)


def _loader(name: str, vty, llty, dtype, align: int, doc: str):
    """An intrinsic ``name(arr, index)``: 16 lanes of ``vty`` from (flat) element ``index`` of a C-contiguous array
    (of ``dtype``; any when None)."""
    def typer(typingctx, arr, index):
        if not isinstance(arr, types.Array) or arr.layout != "C" or (dtype is not None and arr.dtype != dtype):
            return None

        def codegen(context, builder, sig, args):
            p = _element_ptr(context, builder, sig.args[0], args[0], args[1])
            return builder.load(builder.bitcast(p, llty.as_pointer()), align=align)

        return vty(arr, types.intp), codegen

    return _named(typer, name, doc)


def _storer(name: str, vty, llty, dtype, doc: str):
    """An intrinsic ``name(arr, index, v)``: the 16 lanes of ``v`` into ``dtype`` array ``arr`` from (flat) element
    ``index``."""
    def typer(typingctx, arr, index, v):
        if not isinstance(arr, types.Array) or arr.layout != "C" or arr.dtype != dtype:
            return None

        def codegen(context, builder, sig, args):
            p = _element_ptr(context, builder, sig.args[0], args[0], args[1])
            builder.store(args[2], builder.bitcast(p, llty.as_pointer()), align=4)
            return context.get_dummy_value()

        return types.void(arr, types.intp, vty), codegen

    return _named(typer, name, doc)


def _lanewise(name: str, vty, op: str, doc: str):
    """An intrinsic ``name(a, b)``: LLVM's ``op`` (an ``IRBuilder`` method) on two ``vty`` vectors, lane by lane."""
    def typer(typingctx, a, b):
        def codegen(context, builder, sig, args):
            return getattr(builder, op)(args[0], args[1])

        return vty(vty, vty), codegen

    return _named(typer, name, doc)


vload = _loader("vload", I32x16, _V16, None, 1, "64 bytes of ``arr`` starting at (flat) element ``index``, unaligned.")
fload = _loader("fload", F32x16, _F16, types.float32, 4, "16 float32 of ``arr`` from (flat) element ``index``.")
vstore = _storer("vstore", I32x16, _V16, types.int32,
                 "The 16 lanes of ``v`` into int32 array ``arr`` at (flat) elements ``index .. index + 15``.")
fstore = _storer("fstore", F32x16, _F16, types.float32,
                 "The 16 lanes of ``v`` into float32 array ``arr`` at (flat) elements ``index .. index + 15``.")
vand = _lanewise("vand", I32x16, "and_", "Lane-wise bitwise and.")
vadd = _lanewise("vadd", I32x16, "add", "Lane-wise int32 sum (wrapping).")
vsub = _lanewise("vsub", I32x16, "sub", "Lane-wise int32 difference (wrapping).")
fadd = _lanewise("fadd", F32x16, "fadd", "Lane-wise IEEE float32 ``a + b`` (no fast-math flags: never fused or reordered).")
fmul = _lanewise("fmul", F32x16, "fmul", "Lane-wise IEEE float32 ``a * b``.")


def _splat(builder, v):
    vec = builder.insert_element(ir.Constant(_V16, ir.Undefined), v, ir.Constant(_I32, 0))
    return builder.shuffle_vector(vec, vec, ir.Constant(_V16, None))


@intrinsic
def vbcast4(typingctx, arr, index):
    """The 4 bytes of ``arr`` at (flat) element ``index`` read as one int32, in all 16 lanes."""
    if not isinstance(arr, types.Array) or arr.layout != "C":
        return None

    def codegen(context, builder, sig, args):
        p = _element_ptr(context, builder, sig.args[0], args[0], args[1])
        return _splat(builder, builder.load(builder.bitcast(p, _I32.as_pointer()), align=1))

    return I32x16(arr, types.intp), codegen


@intrinsic
def vsplat(typingctx, v):
    """The int32 ``v`` in all 16 lanes."""
    def codegen(context, builder, sig, args):
        return _splat(builder, context.cast(builder, args[0], sig.args[0], types.int32))

    return I32x16(v), codegen


@intrinsic
def vsrl4(typingctx, a):
    """Each 32-bit lane shifted right by 4, zeros in (the high nibbles of every byte, once masked)."""
    def codegen(context, builder, sig, args):
        return builder.lshr(args[0], _splat(builder, ir.Constant(_I32, 4)))

    return I32x16(I32x16), codegen


@intrinsic
def vdpbusd(typingctx, acc, u, s):
    """AVX-512 VNNI ``vpdpbusd``: per lane, ``acc`` plus the four products of ``u``'s unsigned bytes
    with ``s``'s signed bytes (wrapping int32, which the kernels' sums never reach)."""
    def codegen(context, builder, sig, args):
        fnty = ir.FunctionType(_V16, [_V16, _V16, _V16])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.x86.avx512.vpdpbusd.512")
        return builder.call(fn, args)

    return I32x16(I32x16, I32x16, I32x16), codegen


def _avx2_dot(builder, acc, u, s, q8: bool):
    """``acc + sum of 4 products`` per lane through AVX2's ``pmaddubsw`` + ``pmaddwd`` on the two
    256-bit halves.  ``q8``: ``u`` holds int8 plus 128; the products are ``(u - 128) * s``, taken as
    ``|w| * (s signed by w)`` so that no 16-bit pair sum saturates (|s| <= 127)."""
    mod = builder.module
    i8x32, i16x16, i32x8 = ir.VectorType(ir.IntType(8), 32), ir.VectorType(ir.IntType(16), 16), ir.VectorType(_I32, 8)
    ubsw = cgutils.get_or_insert_function(mod, ir.FunctionType(i16x16, [i8x32, i8x32]), "llvm.x86.avx2.pmadd.ub.sw")
    wd = cgutils.get_or_insert_function(mod, ir.FunctionType(i32x8, [i16x16, i16x16]), "llvm.x86.avx2.pmadd.wd")
    ones = ir.Constant(i16x16, [1] * 16)
    halves = []
    for h in (0, 1):
        idx = ir.Constant(ir.VectorType(_I32, 8), list(range(8 * h, 8 * h + 8)))
        uh = builder.bitcast(builder.shuffle_vector(u, u, idx), i8x32)
        sh = builder.bitcast(builder.shuffle_vector(s, s, idx), i8x32)
        if q8:
            w = builder.xor(uh, ir.Constant(i8x32, [0x80] * 32))
            absf = cgutils.get_or_insert_function(mod, ir.FunctionType(i8x32, [i8x32, ir.IntType(1)]), "llvm.abs.v32i8")
            sign = cgutils.get_or_insert_function(mod, ir.FunctionType(i8x32, [i8x32, i8x32]), "llvm.x86.avx2.psign.b")
            uh, sh = builder.call(absf, [w, ir.Constant(ir.IntType(1), 0)]), builder.call(sign, [sh, w])
        halves.append(builder.call(wd, [builder.call(ubsw, [uh, sh]), ones]))
    return builder.add(acc, builder.shuffle_vector(halves[0], halves[1], ir.Constant(_V16, list(range(16)))))


def _avx2_dpbusd(name: str, q8: bool, doc: str):
    def typer(typingctx, acc, u, s):
        def codegen(context, builder, sig, args):
            return _avx2_dot(builder, *args, q8=q8)

        return I32x16(I32x16, I32x16, I32x16), codegen

    return _named(typer, name, doc)


vdpbusd_avx2 = _avx2_dpbusd("vdpbusd_avx2", False, """``vdpbusd`` for codes ``u`` of at most 15 (Q4 nibbles) on AVX2: the
same exact sums (a pair of products stays within int16).""")
vdpbusd_q8_avx2 = _avx2_dpbusd("vdpbusd_q8_avx2", True, """``acc[l] + sum_k (u8(u[l][k]) - 128) * i8(s[l][k])`` on AVX2
(Q8_0's codes: the int8 plus 128): exact for activations ``s`` in -127..127.""")


@intrinsic
def vtofloat(typingctx, a):
    """Each int32 lane as float32 (exact below 2**24)."""
    def codegen(context, builder, sig, args):
        return builder.sitofp(args[0], _F16)

    return F32x16(I32x16), codegen


@intrinsic
def fsplat(typingctx, v):
    """The float32 ``v`` in all 16 lanes."""
    def codegen(context, builder, sig, args):
        x = context.cast(builder, args[0], sig.args[0], types.float32)
        vec = builder.insert_element(ir.Constant(_F16, ir.Undefined), x, ir.Constant(_I32, 0))
        return builder.shuffle_vector(vec, vec, ir.Constant(_V16, None))

    return F32x16(v), codegen


@intrinsic
def ffma(typingctx, a, b, c):
    """Lane-wise ``a * b + c`` with one rounding (``llvm.fma``: one ``vfmadd`` on CPUs with FMA). Not used by
    the decode kernels, whose sums keep separate roundings; for float32 products where that is not needed."""
    def codegen(context, builder, sig, args):
        return builder.call(_llvm_fn(builder, "llvm.fma.v16f32", _F16, [_F16, _F16, _F16]), args)

    return F32x16(F32x16, F32x16, F32x16), codegen


@intrinsic
def fhalves(typingctx, h, index):
    """The 16 IEEE halves stored as uint16 in ``h`` from (flat) element ``index``, as float32
    (exact; one ``vcvtph2ps``)."""
    if not isinstance(h, types.Array) or h.layout != "C" or h.dtype != types.uint16:
        return None

    def codegen(context, builder, sig, args):
        half16 = ir.VectorType(ir.HalfType(), 16)
        p = _element_ptr(context, builder, sig.args[0], args[0], args[1])
        return builder.fpext(builder.load(builder.bitcast(p, half16.as_pointer()), align=2), _F16)

    return F32x16(h, types.intp), codegen


@intrinsic
def half_bits(typingctx, v):
    """The IEEE half nearest float32 ``v`` (ties to even), as its uint16 bit pattern (one
    ``vcvtps2ph`` on x86-64 with F16C)."""
    if v != types.float32:
        return None

    def codegen(context, builder, sig, args):
        return builder.bitcast(builder.fptrunc(args[0], ir.HalfType()), ir.IntType(16))

    return types.uint16(types.float32), codegen


@intrinsic
def prefetch(typingctx, arr, index):
    """Hint the cache line holding (flat) element ``index`` of ``arr`` into the caches (no fault
    past the end)."""
    if not isinstance(arr, types.Array) or arr.layout != "C":
        return None

    def codegen(context, builder, sig, args):
        p = builder.bitcast(_element_ptr(context, builder, sig.args[0], args[0], args[1]), ir.IntType(8).as_pointer())
        fnty = ir.FunctionType(ir.VoidType(), [ir.IntType(8).as_pointer(), _I32, _I32, _I32])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0")
        builder.call(fn, [p, ir.Constant(_I32, 0), ir.Constant(_I32, 3), ir.Constant(_I32, 1)])
        return context.get_dummy_value()

    return types.void(arr, types.intp), codegen


@intrinsic
def f32_bits(typingctx, v):
    """The bit pattern of float32 ``v`` as an int32 (any CPU; loops of it vectorize)."""
    if v != types.float32:
        return None

    def codegen(context, builder, sig, args):
        return builder.bitcast(args[0], _I32)

    return types.int32(types.float32), codegen


@intrinsic
def bits_f32(typingctx, v):
    """The float32 whose bit pattern is the integer ``v`` (its low 32 bits)."""
    if not isinstance(v, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        return builder.bitcast(context.cast(builder, args[0], sig.args[0], types.int32), ir.FloatType())

    return types.float32(v), codegen


def _llvm_fn(builder, name, ret, argtys):
    return cgutils.get_or_insert_function(builder.module, ir.FunctionType(ret, argtys), name)


@intrinsic
def fabsmax(typingctx, v):
    """The largest ``|lane|`` of ``v`` (as the largest bit pattern without the sign: the same
    value as comparing the floats, for finite ones; order-free, so exact)."""
    if v != F32x16:
        return None

    def codegen(context, builder, sig, args):
        bits = builder.and_(builder.bitcast(args[0], _V16), ir.Constant(_V16, [0x7FFFFFFF] * 16))
        top = builder.call(_llvm_fn(builder, "llvm.vector.reduce.umax.v16i32", _I32, [_V16]), [bits])
        return builder.bitcast(top, ir.FloatType())

    return types.float32(F32x16), codegen


@intrinsic
def vquant(typingctx, v, inv):
    """``rint(v * inv)`` in each lane (nearest, ties to even) as int32: the 8-bit codes of an
    activation block (``|v * inv|`` <= 127)."""
    if v != F32x16 or inv != types.float32:
        return None

    def codegen(context, builder, sig, args):
        vec = builder.insert_element(ir.Constant(_F16, ir.Undefined), args[1], ir.Constant(_I32, 0))
        scaled = builder.fmul(args[0], builder.shuffle_vector(vec, vec, ir.Constant(_V16, None)))
        rounded = builder.call(_llvm_fn(builder, "llvm.rint.v16f32", _F16, [_F16]), [scaled])
        return builder.fptosi(rounded, _V16)

    return I32x16(F32x16, types.float32), codegen


@intrinsic
def vstore_i8(typingctx, arr, index, v):
    """The 16 int32 lanes of ``v`` (each within -128..127) as 16 bytes of int8 array ``arr`` from
    (flat) element ``index``."""
    if not isinstance(arr, types.Array) or arr.layout != "C" or arr.dtype != types.int8:
        return None

    def codegen(context, builder, sig, args):
        i8x16 = ir.VectorType(ir.IntType(8), 16)
        p = _element_ptr(context, builder, sig.args[0], args[0], args[1])
        builder.store(builder.trunc(args[2], i8x16), builder.bitcast(p, i8x16.as_pointer()), align=1)
        return context.get_dummy_value()

    return types.void(arr, types.intp, I32x16), codegen


@intrinsic
def vhsum(typingctx, v):
    """The 16 int32 lanes of ``v`` added (integers: any order, one result)."""
    if v != I32x16:
        return None

    def codegen(context, builder, sig, args):
        return builder.call(_llvm_fn(builder, "llvm.vector.reduce.add.v16i32", _I32, [_V16]), [args[0]])

    return types.int32(I32x16), codegen


def target_features() -> set[str]:
    """The CPU features numba compiles for: ``NUMBA_CPU_FEATURES`` when set, else the host's
    (empty when ``NUMBA_CPU_NAME`` names another CPU without listing its features)."""
    if numba.config.CPU_FEATURES:
        return {f[1:] for f in numba.config.CPU_FEATURES.split(",") if f.startswith("+")}
    if numba.config.CPU_NAME and numba.config.CPU_NAME != "host":
        return set()
    feats = ll.get_host_cpu_features()
    return {name for name, on in feats.items() if on}


def has_avx2() -> bool:
    """Whether ``vdpbusd_avx2`` / ``vdpbusd_q8_avx2`` (and the halves' conversions) compile for this target."""
    return {"avx2", "f16c"} <= target_features()


def has_vnni() -> bool:
    """Whether ``vdpbusd`` (and the 512-bit vectors around it) can be compiled for this target."""
    f = target_features()
    return {"avx512vnni", "avx512bw", "avx512f"} <= f



@intrinsic
def fhsum(typingctx, v):
    """The 16 lanes of ``v`` added in one fixed order, in registers: lanes ``j`` and ``j + 8``,
    then ``j`` and ``j + 4`` of those, then ``j + 2``, then ``j + 1`` (IEEE adds, no reordering)."""
    if v != F32x16:
        return None

    def codegen(context, builder, sig, args):
        return _lane_tree(builder, args[0], builder.fadd)

    return types.float32(F32x16), codegen


def _lane_tree(builder, x, combine):
    """Lane 0 of ``x`` after combining lanes ``j`` and ``j + 8``, then ``j + 4``, ``j + 2``, ``j + 1``:
    ``combine(x, shuffled)`` at each step."""
    undef = ir.Constant(_F16, ir.Undefined)
    for w in (8, 4, 2, 1):
        x = combine(x, builder.shuffle_vector(x, undef, ir.Constant(_V16, [j + w if j < w else j for j in range(16)])))
    return builder.extract_element(x, ir.Constant(_I32, 0))


@intrinsic
def fsum16(typingctx, arr, index):
    """Lane ``p`` = ``fhsum`` of the ``p``-th of the 16 vectors stored in float32 array ``arr`` from (flat) element
    ``index`` (vector ``p`` at ``index + 16 p``): the same pairwise tree per vector, run on all 16 at once by
    shuffling pairs of vectors together (15 adds instead of 64), so each lane's adds are ``fhsum``'s, in its order."""
    if not isinstance(arr, types.Array) or arr.layout != "C" or arr.dtype != types.float32:
        return None

    def codegen(context, builder, sig, args):
        base = _element_ptr(context, builder, sig.args[0], args[0], args[1])
        xs = [builder.load(builder.bitcast(builder.gep(base, [ir.Constant(ir.IntType(64), 16 * i)]), _F16.as_pointer()), align=4)
              for i in range(16)]
        for w in (8, 4, 2, 1):
            groups = 16 // (2 * w)  # groups of 2w lanes in each input vector, one position each
            lo = [(m >= groups) * 16 + 2 * w * (m % groups) + t for m in range(2 * groups) for t in range(w)]
            hi = [i + w for i in lo]
            xs = [builder.fadd(builder.shuffle_vector(a, b, ir.Constant(_V16, lo)), builder.shuffle_vector(a, b, ir.Constant(_V16, hi)))
                  for a, b in zip(xs[0::2], xs[1::2], strict=True)]
        return xs[0]

    return F32x16(arr, types.intp), codegen


@intrinsic
def fmax(typingctx, a, b):
    """Lane-wise larger of ``a`` and ``b`` (``b`` where they are equal or unordered)."""
    def codegen(context, builder, sig, args):
        return builder.select(builder.fcmp_ordered(">", args[0], args[1]), args[0], args[1])

    return F32x16(F32x16, F32x16), codegen


@intrinsic
def fhmax(typingctx, v):
    """The largest lane of ``v`` (exact: a maximum does not depend on the order)."""
    if v != F32x16:
        return None

    def codegen(context, builder, sig, args):
        return _lane_tree(builder, args[0], lambda x, y: builder.select(builder.fcmp_ordered(">", x, y), x, y))

    return types.float32(F32x16), codegen
