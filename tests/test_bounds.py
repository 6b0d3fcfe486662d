"""analysis/bounds.py: the interval of a value made from positions and constants holds every value the graph
computes (checked against onnx's reference evaluator in float64 on random chains), names its positions and the
arithmetic between, and answers a chain far deeper than Python's recursion limit without recursing."""

from __future__ import annotations

import math

import numpy as np
import onnx
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper
from onnx.reference import ReferenceEvaluator

from precaudit.analysis.bounds import bounds_of
from precaudit.frontends.onnx import load_onnx

_UNARY = ("Neg", "Abs", "Floor", "Ceil", "Exp", "Reciprocal")
_BINARY = ("Add", "Sub", "Mul", "Div", "Max", "Min", "Pow")
_SHAPES = ("Unsqueeze", "Concat", "Where", "Clip")


def _const(name: str, value, dtype=np.float64) -> onnx.TensorProto:
    return numpy_helper.from_array(np.array(value, dtype), name)


def _chain(n: int, start: float, steps: list[tuple[str, float, float, int]], seed: int) -> onnx.ModelProto:
    """Range(start, start + n) in float64, then each step an op on the value so far and a constant vector of n
    values spread over [c, c + width] in a random order (so it is no function of the position), as the first
    operand or the second, or (order 2) on the value so far and the Range itself (two operands from one source)."""
    rng = np.random.default_rng(seed)
    inits = [_const("start", start), _const("limit", start + n), _const("delta", 1.0), _const("axis", [0], np.int64),
             numpy_helper.from_array(rng.random(n) < 0.5, "cond")]
    nodes = [h.make_node("Range", ["start", "limit", "delta"], ["v0"], name="range")]
    for i, (op, c, width, order) in enumerate(steps):
        x, out, k = f"v{i}", f"v{i + 1}", f"c{i}"
        values = c + width * rng.permutation(np.linspace(0.0, 1.0, n))
        if op in ("Div", "Pow"):  # a divisor away from 0, a positive base: their bounded forms
            values = np.abs(values) + 0.5
        inits.append(_const(k, values))
        first, second = ((k, x) if order == 0 else (x, k)) if order < 2 else (x, "v0")
        if op in _UNARY:
            nodes.append(h.make_node(op, [x], [out], name=out))
        elif op == "Pow":  # c ** (x / big): a frequency table's form
            nodes += [h.make_node("Div", [x, f"big{i}"], [f"e{i}"], name=f"e{i}"),
                      h.make_node("Pow", [k, f"e{i}"], [out], name=out)]
            inits.append(_const(f"big{i}", 1000.0 + abs(start) + n))
        elif op == "Unsqueeze":
            nodes += [h.make_node("Unsqueeze", [x, "axis"], [f"u{i}"], name=f"u{i}"),
                      h.make_node("Squeeze", [f"u{i}", "axis"], [out], name=out)]
        elif op == "Concat":
            nodes += [h.make_node("Concat", [first, second], [f"u{i}"], name=f"u{i}", axis=0),
                      h.make_node("Slice", [f"u{i}", f"s{i}", f"l{i}"], [out], name=out)]
            inits += [_const(f"s{i}", [n // 2], np.int64), _const(f"l{i}", [n // 2 + n], np.int64)]
        elif op == "Where":
            nodes.append(h.make_node("Where", ["cond", first, second], [out], name=out))
        elif op == "Clip":
            nodes += [h.make_node("ReduceMin", [k], [f"m{i}"], name=f"m{i}", keepdims=0),
                      h.make_node("Clip", [x, f"m{i}", ""], [out], name=out)]
        else:
            nodes.append(h.make_node(op, [first, second], [out], name=out))
    last = f"v{len(steps)}"
    graph = h.make_graph(nodes, "chain", [], [h.make_tensor_value_info(last, T.DOUBLE, [n])], inits)
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=10)


_STEP = st.tuples(st.sampled_from(_UNARY + _BINARY + _SHAPES), st.floats(-8, 8, allow_nan=False),
                  st.floats(0, 8, allow_nan=False), st.integers(0, 2))


@settings(max_examples=150, deadline=None, derandomize=True)
@given(n=st.integers(1, 40), start=st.integers(-50, 50), steps=st.lists(_STEP, min_size=1, max_size=6),
       seed=st.integers(0, 2**16))
def test_every_computed_value_lies_in_the_interval(tmp_path_factory, n, start, steps, seed):
    model = _chain(n, float(start), steps, seed)
    path = tmp_path_factory.mktemp("chain") / "m.onnx"
    onnx.save(model, str(path))
    with np.errstate(all="ignore"):
        (got,) = ReferenceEvaluator(model).run(None, {})
    if not np.isfinite(got).all():
        return  # Exp of a large value, a division by 0: float64's own inf, beyond what an interval says of reals
    graph = load_onnx(str(path))
    bounded = bounds_of(graph.outputs[0])
    assert bounded is not None and bounded.positions is not None
    iv = bounded.interval
    slack = 1e-9 * max(1.0, float(np.abs(got).max()))  # float64's own rounding along the chain
    assert iv.lo - slack <= got.min() and got.max() <= iv.hi + slack, (steps, iv, got.min(), got.max())


def _graph(model: onnx.ModelProto, tmp_path) -> object:
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    return load_onnx(str(path))


def test_a_grid_scaled_and_shifted_is_bounded_exactly(tmp_path):
    """(Range(0, 4096) / 4096 * 2 - 1) * 1570.8: [-1570.8, 1570.8], the Range's positions [0, 4096]."""
    inits = [_const(n, v, np.float32) for n, v in (("s", 0.0), ("l", 4096.0), ("d", 1.0), ("size", 4096.0),
                                                   ("two", 2.0), ("one", 1.0), ("f", 1570.8))]
    nodes = [h.make_node("Range", ["s", "l", "d"], ["p"], name="range"),
             h.make_node("Div", ["p", "size"], ["a"], name="div"), h.make_node("Mul", ["a", "two"], ["b"], name="mul"),
             h.make_node("Sub", ["b", "one"], ["c"], name="sub"), h.make_node("Mul", ["c", "f"], ["y"], name="scale")]
    graph = h.make_graph(nodes, "g", [], [h.make_tensor_value_info("y", T.FLOAT, [4096])], inits)
    g = _graph(h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=10), tmp_path)
    found = bounds_of(g.outputs[0])
    assert found is not None and found.positions is not None
    assert (found.interval.lo, found.interval.hi) == (-1.0 * np.float32(1570.8), float(np.float32(1570.8)))
    assert (found.positions.kind, found.positions.interval.hi, found.steps) == ("Range", 4096.0, ("Div", "Mul", "Sub",
                                                                                                   "Mul"))
    assert [n.name for n in found.chain] == ["range", "div", "mul", "sub", "scale"]


def test_a_symbolic_dim_leaves_it_unbounded_until_sized(tmp_path):
    inits = [_const("zero", 0, np.int64)]
    nodes = [h.make_node("Shape", ["x"], ["shape"], name="shape"),
             h.make_node("Gather", ["shape", "zero"], ["n"], name="n", axis=0),
             h.make_node("Range", ["zero", "n", "one"], ["p"], name="range"),
             h.make_node("Cast", ["p"], ["y"], name="cast", to=T.FLOAT)]
    inits.append(_const("one", 1, np.int64))
    graph = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", T.FLOAT, ["seq"])],
                         [h.make_tensor_value_info("y", T.FLOAT, ["seq"])], inits)
    g = _graph(h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=10), tmp_path)
    open_ = bounds_of(g.outputs[0])
    assert open_ is not None and open_.positions is not None
    assert (open_.interval.lo, open_.interval.hi, open_.open) == (0.0, math.inf, "the symbolic dim 'seq'")
    assert open_.positions.kind == "Cast of an integer Range"
    sized = bounds_of(g.outputs[0], {"seq": 4096})
    assert sized is not None and (sized.interval.hi, sized.sized_by) == (4096.0, ("seq=4096",))


def test_an_activation_anywhere_means_no_bounds(tmp_path):
    inits = [_const(n, v, np.float32) for n, v in (("s", 0.0), ("l", 8.0), ("d", 1.0))]
    nodes = [h.make_node("Range", ["s", "l", "d"], ["p"], name="range"),
             h.make_node("Mul", ["p", "x"], ["y"], name="mul")]
    graph = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", T.FLOAT, [8])],
                         [h.make_tensor_value_info("y", T.FLOAT, [8])], inits)
    g = _graph(h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=10), tmp_path)
    assert bounds_of(g.outputs[0]) is None


def test_a_chain_deeper_than_the_recursion_limit_is_no_recursion(tmp_path):
    """10,000 Adds of 1 after a Range: past the node budget there is no answer, and no RecursionError; 150 of
    them (within it) are bounded exactly."""
    for depth, expected in ((10_000, None), (150, 8.0 + 150)):
        inits = [_const(n, v, np.float32) for n, v in (("s", 0.0), ("l", 8.0), ("d", 1.0), ("one", 1.0))]
        nodes = [h.make_node("Range", ["s", "l", "d"], ["v0"], name="range")]
        nodes += [h.make_node("Add", [f"v{i}", "one"], [f"v{i + 1}"], name=f"add{i}") for i in range(depth)]
        graph = h.make_graph(nodes, "g", [], [h.make_tensor_value_info(f"v{depth}", T.FLOAT, [8])], inits)
        g = _graph(h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=10), tmp_path)
        found = bounds_of(g.outputs[0])
        assert (found.interval.hi if found is not None else None) == expected


def test_a_matmul_sums_k_products_and_a_cumsum_of_ones_counts(tmp_path):
    """Range(0, 12) reshaped [4, 3] @ W [3, 2] (W in [-2, 3]): each output is within 3 x the products' hull, the
    Range's interval being [0, 12] (between its start and its limit): [3 * 12 * -2, 3 * 12 * 3]; a CumSum of 12
    ones reaches 12."""
    w = np.array([[1.0, -2.0], [3.0, 0.5], [-1.0, 2.0]], np.float32)
    inits = [_const(n, v, np.float32) for n, v in (("s", 0.0), ("l", 12.0), ("d", 1.0), ("ones", np.ones(12)))]
    inits += [_const("shape", [4, 3], np.int64), _const("axis", 0, np.int64), numpy_helper.from_array(w, "w")]
    nodes = [h.make_node("Range", ["s", "l", "d"], ["p"], name="range"),
             h.make_node("Reshape", ["p", "shape"], ["m"], name="reshape"),
             h.make_node("MatMul", ["m", "w"], ["y"], name="matmul"),
             h.make_node("CumSum", ["ones", "axis"], ["c"], name="count")]
    graph = h.make_graph(nodes, "g", [], [h.make_tensor_value_info("y", T.FLOAT, [4, 2]),
                                          h.make_tensor_value_info("c", T.FLOAT, [12])], inits)
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=10)
    g = _graph(model, tmp_path)
    product, count = bounds_of(g.outputs[0]), bounds_of(g.outputs[1])
    assert product is not None and (product.interval.lo, product.interval.hi) == (-72.0, 108.0)
    assert product.steps == ("MatMul",)
    got = ReferenceEvaluator(model).run(None, {})[0]
    assert got.min() >= -72.0 and got.max() <= 108.0
    assert count is not None and count.positions is not None and count.positions.kind == "CumSum of ones"
    assert (count.interval.lo, count.interval.hi) == (0.0, 12.0)
