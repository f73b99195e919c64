"""Every version of every kernel launcher, at every block size it declares, agrees with the NumPy
twin (in the CUDA simulator at the tiny size, at shapes that cross tile edges), is deterministic,
writes every output element and adds into parameter gradients; so does the whole GPU model, whose
tolerance is tight enough to fail a gradient tensor that is 1% off. The agreement harness, run
as a test."""
import contextlib
import dataclasses
import functools
import hashlib
import json
import subprocess
import sys

import numpy as np
import pytest
from numba import cuda

from andrea_numba import check
from andrea_numba.cases import Dims, call
from lab.cases import CASES                 # the whole ladder: every rung of the lab and every engine kernel
from andrea_numba.config import load_config
from andrea_numba.kernels.common import SIMULATOR, BlockDoesNotFit

UTILITIES = {"grad_norm", "grad_scale", "adamw", "zero", "matmul"}


def expected_rows(case) -> set:
    """(op, kernel, version, block) of every version of the case's launchers at every block size."""
    keys = set()
    for direction in ("fwd", "bwd") if case.bwd else ("fwd",):
        kernel = case.fwd if direction == "fwd" else case.bwd
        for version, launch in case.versions(direction).items():
            assert len(launch.blocks) >= 2, f"{launch.__name__}: check at two block sizes or more"
            keys |= {(case.op, kernel, version, str(block).replace(" ", "")) for block in launch.blocks}
    return keys


# ------------------------------------------------------------------------------------------------
# In the simulator the harness's rows are chosen by dry runs: each (version, block) is called with
# the harness's arguments while its launches are recorded instead of run (kernel, grid, block, shared
# memory and every argument: the same buffers at the same offsets, or the same values), with its
# host copies into device arrays, on the same buffers each time, refilled before and hashed after (a
# launcher that wrote one from the host would differ). Two rules leave a row out:
#  - same launches: its record and precision (which picks the twin and the tolerance) are those of a
#    row already checked, so it runs the same kernels on the same inputs. Versions that run another
#    version's code as the harness calls them: without their optional outputs (flash attention v14
#    without y16 is v13, residual_layernorm_bwd v6 without d_resid16 v5, loss_fwd v18 and loss_bwd
#    v16 without stats v17 and v15, mlp_fwd v20 with h in fp32 v19); a TMA version at block "auto"
#    picks the fixed tile it also declares (64 x 64 for every product at these shapes); a version
#    that hands its product on (matmul v16 to v15 or v13; v18, v19 and v23 to v17 where a tensor map
#    cannot read an operand: all of "matmul a^T@b +=" here); loss_fwd v9 is v7 at these blocks.
#  - the products' tile: a linear op's version at a block other than its first launches what it
#    launches at its first (the same kernels on the same buffers), but for its products' tile:
#    each product launch that differs is of a kernel, block and shared memory that a "matmul deep"
#    case checks at a shape that runs the tile past two k-stages and one column tile (K = 72 and
#    N = 136: product_launches, _runs_tile). The op's own code is checked at its first block, the
#    tile at every form by those cases. A tile no deep case runs so (the TMA tiles, 64 deep; the
#    lab's older tiles) leaves no row out.
# The first row of each kind is checked (against the twin, and bit-identical on a rerun).

class _Same:
    """An object compared by identity; held, so that its id is not reused while a record lives."""
    __slots__ = ("obj",)

    def __init__(self, obj):
        self.obj = obj

    def __eq__(self, other):
        return isinstance(other, _Same) and other.obj is self.obj

    def __hash__(self):
        return id(self.obj)


def _digest(a) -> str:
    a = np.ascontiguousarray(getattr(a, "_ary", a))
    return f"{a.dtype.str}{a.shape}:" + hashlib.sha1(a.view(np.uint8)).hexdigest()


def _described(a):
    """An argument as a launch record holds it: an array as (its base array, offset, shape, strides,
    dtype), anything else as its type and repr."""
    a = getattr(a, "_ary", a)
    if isinstance(a, np.ndarray):
        base = a
        while isinstance(base.base, np.ndarray):
            base = base.base
        offset = a.__array_interface__["data"][0] - base.__array_interface__["data"][0]
        return "array", _Same(base), offset, a.shape, a.strides, a.dtype.str
    return "value", type(a).__name__, repr(a)


@contextlib.contextmanager
def launches_recorded(record):
    """The simulator's kernel launches, host copies into device arrays and host writes to them
    appended to `record`; no kernel runs."""
    from numba.cuda.simulator import kernel as K
    from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray
    saved = K.FakeCUDAKernel.__call__, FakeCUDAArray.copy_to_device, FakeCUDAArray.__setitem__

    def launch(kernel, *args):
        record.append(("launch", _Same(kernel), kernel.grid_dim, kernel.block_dim, kernel.dynshared_size,
                       tuple(map(_described, args))))

    def copy(arr, ary, stream=0):
        record.append(("copy", _described(arr), _digest(ary)))

    def write(arr, index, value):
        record.append(("write", _described(arr), repr(index),
                       _digest(value) if hasattr(value, "shape") else repr(value)))

    K.FakeCUDAKernel.__call__, FakeCUDAArray.copy_to_device, FakeCUDAArray.__setitem__ = launch, copy, write
    try:
        yield
    finally:
        K.FakeCUDAKernel.__call__, FakeCUDAArray.copy_to_device, FakeCUDAArray.__setitem__ = saved


def _dry_run(case, launch, block, dims, ref, buffers) -> tuple:
    """What one (version, block) launches with the harness's arguments (launcher_args), on device
    buffers kept in `buffers` (name, shape, dtype -> (host values, device array)) and refilled first:
    (the launch record, each buffer's hash after it)."""
    values, refs, outputs, accums = ref
    inputs, outs, accums, scratch, scalars = check.launcher_args(case, launch, dims, values, refs, outputs, accums)
    host = {**inputs, **check.poisoned_buffers(outs, scratch),
            **{k: np.zeros(np.atleast_1d(refs[k]).shape, np.float32) for k in accums}}
    d = {}
    for name, v in host.items():
        key = (name, v.shape, v.dtype.str)
        if key not in buffers:
            buffers[key] = (v.copy(), cuda.to_device(v))
        buffers[key][1].copy_to_device(buffers[key][0])
        d[name] = buffers[key][1]
    record = []
    with launches_recorded(record):
        call(launch, {**scalars, **d}, **({"block": block} if hasattr(launch, "blocks") else {}))
    assert any(r[0] == "launch" for r in record), f"{launch.__name__}: the dry run recorded no launch"
    return tuple(record), tuple(sorted((k, _digest(v)) for k, v in d.items()))


def _tiny_dims():
    m = load_config("tiny").model
    (B, T), _ = check.SHAPES["tiny"]
    return dataclasses.replace(Dims.of(m, B, min(T, m.context_length)), V=check.OP_VOCAB["tiny"])


def _tile(block):
    """(BM, BN, BK) of a product's declared tile, None for one that names no tile ("auto" picks
    one of the declared tiles, whose row checks it; the naive product's threads)."""
    return tuple(block[:3]) if isinstance(block, tuple) and len(block) >= 4 else None


def _runs_tile(case, values, block) -> bool:
    """Whether the matmul case's product runs the tile past its first k-stage twice and past its
    first column tile: K > 2 BK and N > BN."""
    tile = _tile(block)
    a, b = values["a"], values["b"]
    K = a.shape[0] if case.fixed.get("trans_a") else a.shape[1]
    N = b.shape[0] if case.fixed.get("trans_b") else b.shape[1]
    return tile is not None and K > 2 * tile[2] and N > tile[1]


@functools.cache
def product_launches() -> tuple:
    """What the matmul cases launch (dry runs of every version they check at every block): (every
    kernel they launch: the products, their operand copies and split-K sums; the (kernel, block,
    shared memory) of each launch of a (version, tile) whose case runs it past two k-stages and one
    column tile, _runs_tile)."""
    dims, rng, kernels, run_deep = _tiny_dims(), np.random.default_rng(0), set(), set()
    for case in CASES.values():
        if case.fwd != "matmul":
            continue
        ref, buffers = check.reference_for(case, "fwd", dims, rng), {}
        for launch in case.versions("fwd").values():
            for block in launch.blocks:
                record, _ = _dry_run(case, launch, block, dims, ref, buffers)
                launches = [r for r in record if r[0] == "launch"]
                kernels |= {r[1] for r in launches}
                if _runs_tile(case, ref[0], block):
                    run_deep |= {(r[1], r[3], r[4]) for r in launches}
    return frozenset(kernels), frozenset(run_deep)


def _same_buffers(a, b) -> bool:
    """Two launches' arguments are the same arrays (buffer, offset, shape, strides, dtype) in the
    same places; values (a k-slice's length, which follows the tile) may differ."""
    return len(a) == len(b) and all(x == y or x[0] == y[0] == "value" for x, y in zip(a, b))


def _only_products_differ(first, other) -> bool:
    """Whether two dry runs of one version at two blocks differ only in the tile of their product
    launches: every launch that differs is a product kernel's on the same buffers, and the other
    block's launch is of a (kernel, block, shared memory) that a matmul case checks at a shape that
    runs the tile past two k-stages and one column tile (product_launches)."""
    (rec_a, after_a), (rec_b, after_b) = first, other
    if after_a != after_b or len(rec_a) != len(rec_b):
        return False
    kernels, run_deep = product_launches()
    return all(a == b or (a[0] == b[0] == "launch" and a[1] in kernels and (b[1], b[3], b[4]) in run_deep
                          and _same_buffers(a[5], b[5]))
               for a, b in zip(rec_a, rec_b))


def harness_rows(op, seed=1234, versions=None):
    """check.run_checks("tiny", seed, model=False, only=[op])'s rows (op_rows' loop: every version at
    every block, at the tiny size's op shapes), less the rows the dry runs leave out: (rows, {(op,
    kernel, version, block) left out: (the checked row it is, why)}), why "same launches" (the row's
    launches are a checked row's) or "the products' tile" (at this block the version launches what it
    launches at its first, but for its products' tile, which a deep matmul case checks:
    _only_products_differ). On a GPU every row."""
    if not SIMULATOR:
        return check.run_checks("tiny", seed=seed, model=False, only=[op], versions=versions, cases=CASES), {}
    dims, rng = _tiny_dims(), np.random.default_rng(seed)
    case, rows, left = CASES[op], [], {}
    for direction in ("fwd", "bwd") if case.bwd else ("fwd",):
        kernel = case.fwd if direction == "fwd" else case.bwd
        ref = check.reference_for(case, direction, dims, rng)
        low, checked, buffers = {}, {}, {}
        for version, launch in case.versions(direction, versions).items():
            precision = getattr(launch, "precision", None)
            if precision is not None and precision not in low:
                low[precision] = check.low_precision_reference(case, direction, ref, precision)
            first = None          # (the row that checks the version's first block, that block's dry run)
            for block in launch.blocks:
                label = (op, kernel, version, str(block).replace(" ", ""))
                try:
                    run = _dry_run(case, launch, block, dims, ref, buffers)
                except BlockDoesNotFit:                 # check_launcher says so, as op_rows does
                    run = None
                key = None if run is None else (precision, run)
                if key is not None and key in checked:
                    left[label] = (checked[key], "same launches")
                elif (first is not None and None not in (first[1], run) and case.fwd != "matmul"
                      and _only_products_differ(first[1], run)):
                    left[label] = (first[0], "the products' tile")
                else:
                    if key is not None:
                        checked[key] = label
                    try:
                        rows += check.check_launcher(case, direction, launch, dims, rng, block, version, ref,
                                                     low=low.get(precision))
                    except BlockDoesNotFit as e:
                        print(f"not checked at this size: {e}", file=sys.stderr)
                if first is None:
                    first = (left[label][0] if label in left else label, run)
    return rows, left


# One harness run per op (not one for all): each is a test of its own, so `pytest -n` spreads them
# over the CPU's cores.
@pytest.mark.slow
@pytest.mark.parametrize("op", sorted(CASES))
def test_kernels_agree_with_the_twin(op):
    """Every version of the op's launchers at every block size it declares has a harness row (a new
    version in a module's VERSIONS is checked without another edit; one the harness misses fails),
    or is a checked row by the dry runs (harness_rows); every checked row agrees with the twin and
    reruns bit-identically."""
    mine, left = harness_rows(op)
    assert mine and all(r["op"] == op for r in mine)
    seen = {(r["op"], r.get("kernel"), r.get("version"), r.get("block")) for r in mine}
    assert {row for row, _ in left.values()} <= seen and not set(left) & seen
    missing = expected_rows(CASES[op]) - seen - set(left)
    assert not missing, f"no harness row for {sorted(missing)[:5]}"
    for r in mine:
        assert r["ok"], r
        assert r["bitwise_repeat"], r


@pytest.mark.skipif(not SIMULATOR, reason="the dry run records the simulator's launches")
def test_a_dry_run_tells_the_same_launches_from_others():
    """The records of harness_rows: matmul v18 at "auto" and at the 64 x 64 tile it picks for the
    harness's product are the same launches; at its 64 x 128 tile, and v19 (another kernel) at
    "auto", they are not; flash attention v14 without its bf16 outputs launches v13's kernels; a
    launcher that also writes an output from the host differs. mlp v9's two blocks differ in matmul
    v8's tile alone, mlp v1's in its own kernel's tile too."""
    from andrea_numba.kernels import matmul as MM
    from lab import matmul as lab_matmul
    dims = _tiny_dims()
    rng = np.random.default_rng(0)
    case = CASES["matmul"]
    ref = check.reference_for(case, "fwd", dims, rng)
    buffers = {}
    run = lambda launch, block: _dry_run(case, launch, block, dims, ref, buffers)
    auto = run(MM.matmul_bf16_wgmma, MM.TMA_AUTO)
    assert auto == run(MM.matmul_bf16_wgmma, (64, 64, 64, 2)) == run(MM.matmul_bf16_wgmma, MM.TMA_AUTO)
    assert auto != run(MM.matmul_bf16_wgmma, (64, 128, 64, 3)) and auto != run(lab_matmul.matmul_v19, MM.TMA_AUTO)

    def host_write(out, work, a, b, trans_a=False, trans_b=False, accumulate=False, *, block, stream=0):
        MM.matmul_bf16_wgmma(out, work, a, b, trans_a, trans_b, accumulate, block=block, stream=stream)
        out[0, 0] = 1.0                                      # recorded as a host write to the output

    def host_copy(out, work, a, b, trans_a=False, trans_b=False, accumulate=False, *, block, stream=0):
        MM.matmul_bf16_wgmma(out, work, a, b, trans_a, trans_b, accumulate, block=block, stream=stream)
        np.copyto(out._ary, 0.0)                             # seen in the output's hash
    for other in (host_write, host_copy):
        other.blocks = MM.matmul_bf16_wgmma.blocks
        assert run(other, MM.TMA_AUTO) != auto
    flash = CASES["attn_flash"]
    ref = check.reference_for(flash, "fwd", dims, rng)
    versions = flash.versions("fwd")
    v13, v14 = (_dry_run(flash, versions[v], (1, 16), dims, ref, buffers) for v in (13, 14))
    assert v13 == v14 != _dry_run(flash, versions[13], (2, 16), dims, ref, buffers)
    assert v13 != _dry_run(flash, versions[12], (1, 16), dims, ref, buffers)
    mlp = CASES["mlp"]
    ref = check.reference_for(mlp, "fwd", dims, rng)
    for version, tile_alone in ((9, True), (1, False)):
        launch = mlp.versions("fwd")[version]
        first, other = (_dry_run(mlp, launch, block, dims, ref, buffers) for block in launch.blocks[:2])
        assert first != other and _only_products_differ(first, other) is tile_alone


@pytest.mark.skipif(not SIMULATOR, reason="plants a bug in the simulator's mma.sync twin")
def test_a_tile_that_drops_a_k_term_fails_the_harness(monkeypatch):
    """Plant a bug that only a product deeper than 16 sees, on one tile: matmul_bf16's 64 x 16 tile
    drops the last k term of every m16n8k16 step. The MLP-like matmul cases (K = 8) pass it; the deep
    ones fail it at that tile and only there; and the op rows that the dry runs leave out at that tile
    are left out for a tile the deep cases check (_only_products_differ)."""
    from andrea_numba.kernels import half_tile
    from andrea_numba.kernels.matmul import matmul_bf16
    true_mma = half_tile.mma_bf16_warp

    def drops_k15(a, b):                            # NI = 2 fragments of 8 columns: the 64 x 16 tile
        if b.shape[-3] == 2:
            a = a.copy()
            a[..., 3::4, 2:4] &= 0xFFFF            # lanes t = 3: a2, a3's high halves hold k = 15
        return true_mma(a, b)
    monkeypatch.setattr(half_tile, "mma_bf16_warp", drops_k15)
    tile = "(64,16,32,32,16,4)"
    assert str(matmul_bf16.blocks[1]).replace(" ", "") == tile
    shallow, _ = harness_rows("matmul a^T@b +=", versions=(13,))
    assert shallow and all(r["ok"] for r in shallow)          # K = 8: the dropped term is padding
    deep, _ = harness_rows("matmul deep a^T@b +=", versions=(13,))
    failed = {r["block"] for r in deep if not r["ok"]}
    assert failed == {tile}, failed
    # attn_qkv v12's forward at that tile is left out for it: it launches what it launches at its
    # first block but for that tile's products, which the deep cases check
    case, dims = CASES["attn_qkv"], _tiny_dims()
    launch, ref, buffers = case.versions("fwd")[12], check.reference_for(case, "fwd", dims, np.random.default_rng(0)), {}
    first, other = (_dry_run(case, launch, block, dims, ref, buffers) for block in launch.blocks[:2])
    assert str(launch.blocks[1]).replace(" ", "") == tile and _only_products_differ(first, other)


@pytest.mark.slow
def test_whole_model_checks_loss_and_every_gradient_tensor():
    from andrea_numba.config import load_config
    from andrea_numba.layout import param_layout
    model = check.run_checks("tiny", seed=1234, ops=False)
    assert {r["op"] for r in model} == {"model", "model, flash attention"}
    for op in ("model", "model, flash attention"):
        assert {r["tensor"] for r in model if r["op"] == op} == \
            {"loss"} | {"d " + s.name for s in param_layout(load_config("tiny").model)}
    assert all(r["ok"] and r["bitwise_repeat"] for r in model)


def test_the_model_tolerance_fails_a_gradient_tensor_one_percent_off():
    """The kernels' float32 gradient passes; the same tensor scaled by 1.01 (or by 0.99) fails."""
    rng = np.random.default_rng(0)
    ref = rng.standard_normal(500)
    kernel_like = (ref + ref * rng.standard_normal(500) * 1e-6).astype(np.float32)   # float32-grade error
    assert check.compare("model", "d w", kernel_like, ref, check.MODEL_TOL)["ok"]
    for f in (1.01, 0.99):
        assert not check.compare("model", "d w", (ref * f).astype(np.float32), ref, check.MODEL_TOL)["ok"]


def test_the_op_tolerance_passes_fp32_rounding_and_fails_an_output_scaled_by_1_0001():
    """check.OP_TOL: an output with fp32-grade errors (a float32 sum of 1,000 terms against float64)
    passes; the same output scaled by 1.0001 (or 0.9999) fails, as does one with a term of its sums
    dropped."""
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((40, 1000)), rng.standard_normal((1000, 30))
    ref = a @ b
    f32 = (a.astype(np.float32) @ b.astype(np.float32)).astype(np.float32)
    assert check.compare("matmul", "out", f32, ref, check.OP_TOL)["ok"]
    for f in (1.0001, 0.9999):
        assert not check.compare("matmul", "out", (f32 * np.float32(f)).astype(np.float32), ref, check.OP_TOL)["ok"]
    dropped = (a[:, :-1].astype(np.float32) @ b[:-1].astype(np.float32)).astype(np.float32)
    assert not check.compare("matmul", "out", dropped, ref, check.OP_TOL)["ok"]


def test_command_line_json(tmp_path):
    p = subprocess.run([sys.executable, "-m", "andrea_numba.check", "--json", "--seed", "7", "--op", "residual",
                        "--op", "zero"], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr[-2000:]
    out = json.loads(p.stdout)
    assert out["ok"] is True and out["seed"] == 7 and "simulator" in out["device"]
    assert {r["op"] for r in out["results"]} == {"residual", "zero"}
    for r in out["results"]:
        assert {"op", "kernel", "version", "block", "tensor", "max_abs_err", "rel_err", "tol", "ok"} <= set(r)
    assert "seed 7" in p.stderr
    p = subprocess.run([sys.executable, "-m", "andrea_numba.check", "--op", "softmax"], capture_output=True, text=True)
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "unknown op 'softmax'" in p.stderr
