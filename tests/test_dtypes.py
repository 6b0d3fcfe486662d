"""The format table and rounding agree with the numbers engineers check by hand (ml_dtypes.finfo)."""

import math

import numpy as np
import pytest

from precaudit.dtypes import FORMATS, classify, format_named, round_to_format


@pytest.mark.parametrize("name,fmax,normal,subnormal,ulp", [
    ("fp16", 65504, 6.10e-5, 5.96e-8, 9.77e-4),
    ("bf16", 3.39e38, 1.18e-38, 9.18e-41, 7.81e-3),
    ("fp8-e4m3", 448, 1.56e-2, 1.95e-3, 0.125),
    ("fp8-e5m2", 57344, 6.10e-5, 1.53e-5, 0.25),
    ("fp32", 3.40e38, 1.18e-38, 1.40e-45, 1.19e-7),
])
def test_format_numbers(name, fmax, normal, subnormal, ulp):
    f = FORMATS[name]
    assert (f.max, f.smallest_normal, f.smallest_subnormal, f.ulp_at_1) == pytest.approx((fmax, normal, subnormal, ulp), rel=5e-3)


@pytest.mark.parametrize("eps,rounded,kind", [
    (1e-12, 0.0, "zero"), (1e-9, 0.0, "zero"), (1e-8, 0.0, "zero"),
    (1e-7, 1.1920928955078125e-07, "subnormal"), (1e-6, 1.0132789611816406e-06, "subnormal"),
    (1e-5, 1.0013580322265625e-05, "subnormal"), (1e-4, 1.0001659393310547e-04, "normal"),
    (70000.0, math.inf, "overflow"),
])
def test_eps_in_fp16(eps, rounded, kind):
    assert round_to_format(eps, FORMATS["fp16"]) == rounded
    assert classify(eps, FORMATS["fp16"]) == kind


def test_overflow_bounds():
    assert FORMATS["fp16"].exp_overflow == pytest.approx(11.09, abs=5e-3)
    assert FORMATS["fp32"].exp_overflow == pytest.approx(88.72, abs=5e-3)
    assert FORMATS["fp16"].square_overflow == pytest.approx(255.94, abs=5e-3)


def test_e4m3_has_no_inf_so_overflow_is_nan():
    assert math.isnan(round_to_format(1000.0, FORMATS["fp8-e4m3"]))
    assert classify(1000.0, FORMATS["fp8-e4m3"]) == "overflow"


def test_round_half_to_even():
    # 1 + ulp/2 sits exactly between 1 and 1 + ulp: ties go to the even mantissa, 1.0
    assert round_to_format(1 + 2 ** -11, FORMATS["fp16"]) == 1.0
    assert round_to_format(1 + 3 * 2 ** -11, FORMATS["fp16"]) == 1 + 2 * 2 ** -10


def test_aliases():
    assert format_named("float16") is FORMATS["fp16"] and format_named("E4M3") is FORMATS["fp8-e4m3"]
    with pytest.raises(KeyError):
        format_named("fp12")


@pytest.mark.parametrize("name", ["fp16", "bf16", "fp8-e4m3", "fp8-e5m2", "fp32"])
def test_overflow_threshold_is_where_rounding_leaves_the_range(name):
    f = FORMATS[name]
    quarter_ulp = (f.overflow_threshold - f.max) / 2
    assert round_to_format(f.max + quarter_ulp, f) == f.max  # still rounds back down to max
    assert not math.isfinite(round_to_format(f.overflow_threshold + quarter_ulp, f))


def test_each_format_knows_its_onnx_element_type_and_item_size():
    from onnx import TensorProto as T
    from onnx import helper

    from precaudit.dtypes import ELEMENTS, FORMATS, format_of_onnx_type

    expected = {"fp16": T.FLOAT16, "bf16": T.BFLOAT16, "fp8-e4m3": T.FLOAT8E4M3FN, "fp8-e5m2": T.FLOAT8E5M2,
                "fp32": T.FLOAT, "fp64": T.DOUBLE, "fp4-e2m1": T.FLOAT4E2M1, "fp8-e8m0": T.FLOAT8E8M0}
    assert {name: f.onnx_type for name, f in ELEMENTS.items()} == expected
    # a block-scaled format is stored as its elements
    assert {n: FORMATS[n].onnx_type for n in ("mxfp8", "mxfp4", "nvfp4")} == \
        {"mxfp8": T.FLOAT8E4M3FN, "mxfp4": T.FLOAT4E2M1, "nvfp4": T.FLOAT4E2M1}
    for fmt in ELEMENTS.values():
        assert format_of_onnx_type(fmt.onnx_type) is fmt
        assert fmt.itemsize == helper.tensor_dtype_to_np_dtype(fmt.onnx_type).itemsize
    assert format_of_onnx_type(T.INT64) is None


# ---- element types of stored tensors, and the block-scaled formats ------------------------------------------------

def test_fp4_and_e8m0_numbers():
    from precaudit.dtypes import ELEMENTS

    fp4, e8m0 = ELEMENTS["fp4-e2m1"], ELEMENTS["fp8-e8m0"]
    assert (fp4.max, fp4.smallest_normal, fp4.smallest_subnormal, fp4.ulp_at_1) == (6.0, 1.0, 0.5, 0.5)
    assert (e8m0.smallest_normal, e8m0.max) == (2.0 ** -127, 2.0 ** 127)
    # E8M0 holds powers of two and NaN: no zero, no sign
    assert math.isnan(round_to_format(0.0, e8m0)) and round_to_format(3.0, e8m0) == 4.0
    # FP4 has neither inf nor NaN: a float beyond 6 saturates
    assert round_to_format(100.0, fp4) == 6.0 and round_to_format(0.25, fp4) == 0.0
    assert "fp4-e2m1" not in FORMATS and "fp8-e8m0" not in FORMATS  # no --dtype of their own


def test_block_scaled_formats_are_an_element_a_scale_and_a_block():
    mx8, mx4, nv4 = FORMATS["mxfp8"], FORMATS["mxfp4"], FORMATS["nvfp4"]
    assert [(f.element.name, f.scale.name, f.block, f.global_scale) for f in (mx8, mx4, nv4)] == [
        ("fp8-e4m3", "fp8-e8m0", 32, False), ("fp4-e2m1", "fp8-e8m0", 32, False), ("fp4-e2m1", "fp8-e4m3", 16, True)]
    assert (mx8.emax, mx4.emax) == (8, 2)
    assert format_named("MXFP4") is mx4 and format_named("mxfp8_e4m3") is mx8
    with pytest.raises(KeyError, match="choose one of fp16, bf16, fp8-e4m3, fp8-e5m2, fp32, fp64, mxfp8, mxfp4, nvfp4"):
        format_named("fp12")


def test_properties_replace_name_comparisons():
    assert [n for n, f in FORMATS.items() if f.wide] == ["fp32", "fp64"]
    assert [n for n, f in FORMATS.items() if f.blocked] == ["mxfp8", "mxfp4", "nvfp4"]
    assert [n for n, f in FORMATS.items() if f.held_dtype is np.float64] == ["fp64"]
    assert all(f.is_narrow for n, f in FORMATS.items() if n not in ("fp32", "fp64"))


def _outlier_block(outlier: float = 1000.0) -> np.ndarray:
    x = np.ones(32, np.float32)
    x[7] = outlier
    return x


def test_mxfp4_an_outlier_owns_its_block():
    """amax 1000: the shared exponent is floor(log2 1000) - 2 = 7, so the scale is 128; 1/128 is below E2M1's
    half-step 0.25 and the 31 ones become 0; 1000/128 = 7.8 saturates to 6, giving back 768."""
    from precaudit.dtypes import block_scales, quantize

    fmt = FORMATS["mxfp4"]
    assert block_scales(np.array([1000.0]), fmt).stored.tolist() == [128.0]
    out = quantize(_outlier_block(), fmt)
    assert int(np.count_nonzero(out == 0)) == 31 and out[7] == 768.0


def test_mxfp8_keeps_the_same_block():
    """E4M3 elements: the scale is 2**(9 - 8) = 2; the ones are 0.5 there, exact; 1000/2 = 500 saturates to 448."""
    from precaudit.dtypes import quantize

    out = quantize(_outlier_block(), FORMATS["mxfp8"])
    assert int(np.count_nonzero(out == 1.0)) == 31 and out[7] == 896.0


def test_mx_scale_of_a_zero_block_is_code_0_and_of_a_nan_block_nan():
    from precaudit.dtypes import block_scales

    scales = block_scales(np.array([0.0, np.inf, np.nan, 2.0 ** -125]), FORMATS["mxfp8"])
    assert scales.stored[0] == 2.0 ** -127 and np.isnan(scales.stored[1:3]).all()
    # 2**-125 wants 2**-133: clamped to E8M0's smallest, 2**-127 (ideal keeps what it wanted)
    assert (scales.ideal[3], scales.stored[3]) == (2.0 ** -133, 2.0 ** -127)


def test_nvfp4_scales_as_modelopt_computes_them():
    """Global scale amax / 6 / 448; a block scale amax_block / (6 * global) rounded to E4M3: the block holding the
    tensor's amax gets 448, a block of amax 1e-3 beside an amax of 1000 wants 4.48e-4 < 2**-10 and gets 0."""
    from precaudit.dtypes import block_scales, global_scale_of, quantize

    fmt = FORMATS["nvfp4"]
    x = np.concatenate([np.linspace(-1000, 1000, 16), np.full(16, 1e-3)]).astype(np.float32)
    gs = global_scale_of(x, fmt)
    assert gs == pytest.approx(1000 / 6 / 448, rel=1e-7)
    scales = block_scales(np.array([1000.0, 1e-3]), fmt, gs)
    assert scales.stored.tolist() == [448.0, 0.0]
    out = quantize(x, fmt)
    assert int(np.count_nonzero(out[16:])) == 0 and out[15] == pytest.approx(1000.0, rel=1e-6)
    # the issue's case, with no global scale: amax 1e-6 / 6 = 1.7e-7, far below E4M3's smallest step 2**-9
    assert block_scales(np.array([1e-6]), fmt, 1.0).stored.tolist() == [0.0]
    # an all-zero block's scale is 1.0 (ModelOpt sets it so), not 0/0
    assert block_scales(np.array([0.0]), fmt, 1.0).stored.tolist() == [1.0]


def test_blocks_run_along_the_axis_and_a_short_last_block_is_padded():
    from precaudit.dtypes import quantize

    w = np.ones((40, 3), np.float32)
    w[0, 1] = 1000.0  # blocks along axis 0: rows 0-31 of column 1 are one block, rows 32-39 another
    out = quantize(w, FORMATS["mxfp4"], axis=0)
    assert np.count_nonzero(out == 0, axis=0).tolist() == [0, 31, 0]
    assert round_to_format(1.9, FORMATS["mxfp8"]) == 1.75  # a block of one: 1.9 * 2**8 = 486.4 saturates to 448
