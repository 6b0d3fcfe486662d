"""One contract for a factory's example inputs, in every command and the API: a tuple of positional inputs, a dict
of keyword inputs, or both (`return model, (x,), {"mask": m}`); any other shape is one line and exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import precaudit  # noqa: E402
from precaudit.cli import main  # noqa: E402
from tests.helpers import run_json  # noqa: E402

pytestmark = pytest.mark.slow  # PyTorch captures and real steps: seconds each

FACTORIES = '''
import torch
from torch import nn


class Masked(nn.Module):
    """A hand LayerNorm (eps 1e-12 rounds to 0 in float16) and a mask fill of -1e9 (beyond float16)."""

    def __init__(self):
        super().__init__()
        self.eps = 1e-12

    def forward(self, x, mask=None):
        mean = x.mean(-1, keepdim=True)
        var = ((x - mean) ** 2).mean(-1, keepdim=True)
        y = (x - mean) / torch.sqrt(var + self.eps)
        if mask is not None:
            y = y.masked_fill(mask, -1e9)
        return y


class Regression(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin = nn.Linear(8, 1)

    def forward(self, x, target=None):
        return ((self.lin(x) - target) ** 2).mean()


def _x():
    return torch.randn(2, 8, generator=torch.Generator().manual_seed(0))


def _mask():
    return torch.arange(8).expand(2, 8) > 5


def positional():
    return Masked(), (_x(), _mask())


def keywords():
    return Masked(), {"x": _x(), "mask": _mask()}


def both():
    return Masked(), (_x(),), {"mask": _mask()}


def both_nested():
    return Masked(), ((_x(),), {"mask": _mask()})


def one_tensor_and_keywords():
    return Masked(), _x(), {"mask": _mask()}


def four_items():
    return Masked(), (_x(),), {"mask": _mask()}, 3


def two_dicts():
    return Masked(), {"x": _x()}, {"mask": _mask()}


def unnamed_keyword():
    return Masked(), (_x(),), {1: _mask()}


def model_alone_in_a_tuple():
    return (Masked(),)


def train_positional():
    return Regression(), (_x(), torch.ones(2, 1))


def train_both_and_a_number():
    return Regression(), (_x(),), {"target": torch.ones(2, 1)}, 3


def train_both_with_optimizer():
    model = Regression()
    return model, (_x(),), {"target": torch.ones(2, 1)}, torch.optim.Adam(model.parameters(), eps=1e-8)


def train_positional_with_optimizer():
    model = Regression()
    return model, (_x(), torch.ones(2, 1)), torch.optim.Adam(model.parameters(), eps=1e-8)
'''


@pytest.fixture
def factories(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "factories.py").write_text(FACTORIES)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def findings(tmp_path: Path, spec: str, *args: str) -> list[dict]:
    """The JSON findings of `check SPEC`, without the fields that name the spec (the fingerprint hashes it)."""
    code, report = run_json([spec], *args, out_dir=tmp_path)
    assert report["errors"] == []
    assert code == 1
    return [{k: v for k, v in r.items() if k not in ("model", "fingerprint")} for r in report["results"]]


@pytest.mark.parametrize("factory", ["keywords", "both", "both_nested", "one_tensor_and_keywords"])
def test_each_shape_of_inputs_finds_what_the_tuple_finds(factories: Path, factory: str):
    expected = findings(factories, "factories.py:positional")
    # the mask reached forward(): its fill is found, with the eps
    assert [(r["rule_id"], r["node_name"]) for r in expected] == [("PA101", "add"), ("PA208", "add"),
                                                                  ("PA209", "masked_fill")]
    assert findings(factories, f"factories.py:{factory}") == expected


def test_traced_check_takes_keyword_inputs(factories: Path):
    expected = findings(factories, "factories.py:positional", "--trace")
    assert "PA209" in [r["rule_id"] for r in expected]
    assert findings(factories, "factories.py:both", "--trace") == expected


def test_match_and_keep_list_take_keyword_inputs(factories: Path, capsys: pytest.CaptureFixture):
    assert main(["match", "PA209", "factories.py:keywords"]) == 0
    assert "node 'masked_fill' (Where, constant site): FIRES" in capsys.readouterr().out
    # exit 3: a static list, not checked on the user's data
    assert main(["keep-list", "--for", "pytorch", "factories.py:positional"]) == 3
    expected = capsys.readouterr().out
    assert "keeps 8 nodes in float32" in expected
    assert main(["keep-list", "--for", "pytorch", "factories.py:both"]) == 3
    assert capsys.readouterr().out == expected.replace("factories.py:positional", "factories.py:both")


BAD_SHAPES = {
    "four_items": "four_items() must return a module, (module, inputs) or (module, args, kwargs): inputs a tuple of "
                  "positional inputs, a dict of keyword inputs, or one input; not a tuple of 4",
    "two_dicts": "two_dicts() returned two dicts: give the positional inputs as a tuple, then the keyword inputs as a "
                 "dict",
    "unnamed_keyword": "a keyword input is named 1: keyword inputs are named by forward()'s parameters, as strings",
    "model_alone_in_a_tuple": "model_alone_in_a_tuple() must return a module, (module, inputs) or (module, args, "
                              "kwargs): inputs a tuple of positional inputs, a dict of keyword inputs, or one input; "
                              "not a tuple of 1",
}


@pytest.mark.parametrize("factory", sorted(BAD_SHAPES))
def test_a_bad_shape_is_one_line(factories: Path, capsys: pytest.CaptureFixture, factory: str):
    assert main(["check", f"factories.py:{factory}"]) == 2
    assert capsys.readouterr().err.splitlines() == [f"precaudit: factories.py:{factory}: {BAD_SHAPES[factory]}"]


def train_findings(tmp_path: Path, spec: str) -> list[tuple[str, str]]:
    out = tmp_path / f"{spec.partition(':')[2]}.json"
    code = main(["train", spec, "--regime", "fp16", "-f", "json", "-o", str(out)])
    report = json.loads(out.read_text())
    assert report["errors"] == []
    assert code == 1
    return sorted((r["rule_id"], r["node_name"]) for r in report["results"])


def test_train_takes_keyword_inputs_before_its_optimizer(factories: Path):
    expected = train_findings(factories, "factories.py:train_positional_with_optimizer")
    assert ("PA401", "Adam.eps") in expected
    assert train_findings(factories, "factories.py:train_both_with_optimizer") == expected


def test_train_refuses_a_bad_shape_in_one_line(factories: Path, capsys: pytest.CaptureFixture):
    assert main(["train", "factories.py:train_both_and_a_number"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "precaudit: factories.py:train_both_and_a_number: after (model, inputs) the factory may return a loss_fn and "
        "an optimizer, not int"]


def test_the_api_takes_the_same_shapes(factories: Path):
    import sys

    sys.path.insert(0, str(factories))
    try:
        import factories as made
    finally:
        sys.path.remove(str(factories))
        sys.modules.pop("factories", None)
    x, mask = made._x(), made._mask()
    expected = precaudit.audit(made.Masked(), example_inputs=(x, mask), config=None).findings
    assert [f.rule_id for f in expected] == ["PA101", "PA208", "PA209"]
    for inputs in ({"x": x, "mask": mask}, ((x,), {"mask": mask})):
        assert precaudit.audit(made.Masked(), example_inputs=inputs, config=None).findings == expected
    with pytest.raises(precaudit.InputError) as caught:
        precaudit.audit(made.Masked(), example_inputs=[x])
    assert str(caught.value) == ("example_inputs: auditing an nn.Module needs example_inputs= (a tensor, a tuple of "
                                 "positional inputs, a dict of keyword inputs, or both as ((...), {...})), got list")
