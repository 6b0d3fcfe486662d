"""A fast, fixed subset of the hostile-input fuzzing (the long run is benchmarks/fuzz_hostile.py).

Every case must end in exit 0, 1 or 2; on 2 with exactly one stderr line, otherwise with none; never a traceback
or an 'internal error'. derandomize keeps the cases the same from run to run, so CI never flakes on a new one.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings

from tests.fuzzing import Case, byte_cases, model_cases, rule_cases, run_case
from tests.fuzzing_surfaces import baseline_cases, config_cases, many_model_cases, name_cases, npz_cases, output_cases

_FAST = settings(max_examples=30, derandomize=True, database=None, deadline=None,
                 suppress_health_check=list(HealthCheck))


def _check(case: Case, tmp_path_factory) -> None:
    outcome = run_case(case, tmp_path_factory.mktemp("case"))
    assert outcome.problem() is None and not outcome.internal, (case.notes, case.args, outcome.code, outcome.stderr)


@_FAST
@given(case=model_cases(trace=False))
def test_mutated_models_static(case, tmp_path_factory):
    _check(case, tmp_path_factory)


@settings(_FAST, max_examples=12)
@given(case=model_cases(trace=True))
def test_mutated_models_traced(case, tmp_path_factory):
    _check(case, tmp_path_factory)


@settings(_FAST, max_examples=20)
@given(case=byte_cases())
def test_mutated_model_bytes(case, tmp_path_factory):
    _check(case, tmp_path_factory)


@_FAST
@given(case=rule_cases())
def test_mutated_rule_files(case, tmp_path_factory):
    _check(case, tmp_path_factory)


# the newer surfaces (issue 24): every input file unchanged after the run, outputs parsed back where named


@settings(_FAST, max_examples=15)
@given(case=output_cases())
def test_output_paths(case, tmp_path_factory):
    _check(case, tmp_path_factory)


@settings(_FAST, max_examples=15)
@given(case=name_cases())
def test_names_in_every_renderer(case, tmp_path_factory):
    _check(case, tmp_path_factory)


@settings(_FAST, max_examples=15)
@given(case=baseline_cases())
def test_baselines(case, tmp_path_factory):
    _check(case, tmp_path_factory)


@settings(_FAST, max_examples=15)
@given(case=config_cases())
def test_pyproject(case, tmp_path_factory):
    _check(case, tmp_path_factory)


@settings(_FAST, max_examples=8)
@given(case=many_model_cases())
def test_several_models(case, tmp_path_factory):
    _check(case, tmp_path_factory)


@settings(_FAST, max_examples=10)
@given(case=npz_cases())
def test_traced_inputs_that_size_a_tensor(case, tmp_path_factory):
    _check(case, tmp_path_factory)
