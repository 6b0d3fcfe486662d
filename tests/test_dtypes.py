"""The format table and rounding agree with the numbers engineers check by hand (ml_dtypes.finfo)."""

import math

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

    from precaudit.dtypes import FORMATS, format_of_onnx_type

    expected = {"fp16": T.FLOAT16, "bf16": T.BFLOAT16, "fp8-e4m3": T.FLOAT8E4M3FN, "fp8-e5m2": T.FLOAT8E5M2,
                "fp32": T.FLOAT, "fp64": T.DOUBLE}
    assert {name: f.onnx_type for name, f in FORMATS.items()} == expected
    for fmt in FORMATS.values():
        assert format_of_onnx_type(fmt.onnx_type) is fmt
        assert fmt.itemsize == helper.tensor_dtype_to_np_dtype(fmt.onnx_type).itemsize
    assert format_of_onnx_type(T.INT64) is None
