"""--format html as a person opens it: one file, the findings, the headroom chart's series and limit lines, escaped names."""

from __future__ import annotations

import base64
import hashlib
import re
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import onnx
import pytest

from precaudit.cli import main
from tests.helpers import run_json
from tests.report_models import t5_like

_VOID = {"meta", "br", "input", "link", "img", "hr", "col", "source", "wbr", "area", "base", "embed", "track"}


class Element:
    def __init__(self, tag: str, attrs: dict[str, str | None], parent: Element | None):
        self.tag, self.attrs, self.parent = tag, attrs, parent
        self.content: list[Element | str] = []  # child elements and text, in document order

    @property
    def children(self) -> list[Element]:
        return [c for c in self.content if isinstance(c, Element)]

    @property
    def text(self) -> str:
        return "".join(c if isinstance(c, str) else c.text for c in self.content)

    def iter(self, tag: str | None = None, **attrs: str):
        """Every element below (and including) this one with this tag and these attribute values."""
        stack = [self]
        while stack:
            e = stack.pop()
            if (tag is None or e.tag == tag) and all(e.attrs.get(k.replace("_", "-")) == v for k, v in attrs.items()):
                yield e
            stack.extend(reversed(e.children))

    def classes(self) -> set[str]:
        return set((self.attrs.get("class") or "").split())


class _Tree(HTMLParser):
    """The page as a browser's parser reads it, into Elements (no HTML library needed)."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.root = self.current = Element("#root", {}, None)

    def handle_starttag(self, tag, attrs):
        element = Element(tag, dict(attrs), self.current)
        self.current.content.append(element)
        if tag not in _VOID:
            self.current = element

    def handle_startendtag(self, tag, attrs):
        self.current.content.append(Element(tag, dict(attrs), self.current))

    def handle_endtag(self, tag):
        e = self.current
        while e is not None and e.tag != tag:
            e = e.parent
        if e is not None and e.parent is not None:
            self.current = e.parent

    def handle_data(self, data):
        self.current.content.append(data)


def parse(page: str) -> Element:
    tree = _Tree()
    tree.feed(page)
    tree.close()
    return tree.root


def render(model: Path, tmp_path: Path, *args: str) -> tuple[int, str, Element]:
    out = tmp_path / "report.html"
    code = main([str(model), *args, "--format", "html", "-o", str(out)])
    page = out.read_text(encoding="utf-8")
    return code, page, parse(page)


def assert_self_contained(page: str, root: Element) -> None:
    """Nothing is fetched: every href is an in-page anchor, no src at all, and the policy forbids the network."""
    for e in root.iter():
        assert "src" not in e.attrs, e.tag
        href = e.attrs.get("href")
        assert href is None or href.startswith("#"), href
    assert not any(e.tag in ("link", "img", "iframe", "object", "embed") for e in root.iter())
    assert "url(" not in page and "@import" not in page
    (policy,) = [e.attrs["content"] for e in root.iter("meta") if e.attrs.get("http-equiv") ==
                 "Content-Security-Policy"]
    assert "default-src 'none'" in policy
    (script,) = list(root.iter("script"))  # the one script the policy allows, by its hash
    digest = base64.b64encode(hashlib.sha256(script.text.encode()).digest()).decode()
    assert f"script-src 'sha256-{digest}'" in policy


@pytest.fixture(scope="module")
def climbing(tmp_path_factory):
    """24 T5-like blocks whose activations climb past the float16 max: overflow, then the first inf."""
    return t5_like(tmp_path_factory.mktemp("climb") / "climb.onnx", growth=1.3)


def _as_given(model, tmp_path) -> str:
    """The inputs traced mode would synthesize, saved as the user's own (findings measured on synthesized inputs
    alone are warnings): the same numbers, judged as the user's data."""
    from precaudit.frontends.onnx import load_onnx
    from precaudit.trace.inputs import synthesize_inputs

    path = tmp_path / "inputs.npz"
    np.savez(path, **synthesize_inputs(load_onnx(str(model)), {}, 0))
    return str(path)


def test_traced_report_shows_findings_and_the_headroom_chart(climbing, tmp_path):
    inputs = ("--trace", "--inputs", _as_given(climbing, tmp_path))
    code, page, root = render(climbing, tmp_path, *inputs)
    assert code == 1
    assert_self_contained(page, root)
    _, report = run_json([climbing], *inputs, out_dir=tmp_path)  # the JSON report stays as it was
    expected = {(r["rule_id"], r["node_name"]) for r in report["results"]}

    table = next(root.iter("table", id="findings-table"))
    rows = list(table.iter("tr"))[1:]
    assert {(r.attrs["data-rule"], r.attrs["data-node"]) for r in rows} == expected and len(rows) == len(expected)
    assert [r.attrs["data-severity"] for r in rows][:3] == ["error"] * 3  # worst first
    overflow = next(r for r in rows if r.attrs["data-node"] == "/encoder/block.17/layer.1/layer_norm/Pow")
    assert "max |x| 4.052e+09" in overflow.text and "above the float16 max 65504" in overflow.text
    options = {o.attrs["value"] for o in next(root.iter("select", id="f-rule")).iter("option")}
    assert options == {"", "PA102", "PA208", "PA901", "PA906"}

    chart = next(root.iter("svg", **{"class": "chart headroom"}))
    bands = list(next(chart.iter("g", data_series="values")).iter("rect"))
    assert len(bands) == len(onnx.load(str(climbing)).graph.node)  # one band per value: every node makes one
    limits = {g.attrs["data-limit"]: g for g in chart.iter("g", **{"class": "limit"})}
    assert {k: float(g.attrs["data-value"]) for k, g in limits.items()} == \
        {"max": 65504.0, "smallest-normal": pytest.approx(6.10352e-05), "smallest-subnormal": pytest.approx(5.96046e-08)}
    y = {k: float(next(g.iter("line")).attrs["y1"]) for k, g in limits.items()}
    assert y["max"] < y["smallest-normal"] < y["smallest-subnormal"]  # up the page is larger
    square = next(b for b in bands if b.attrs["data-node"] == "/encoder/block.17/layer.1/layer_norm/Pow")
    assert "over" in square.classes() and float(square.attrs["y"]) < y["max"]
    early = next(b for b in bands if b.attrs["data-node"] == "/encoder/block.0/layer.0/MatMul")
    assert early.classes() == {"band", "held"} and float(early.attrs["y"]) > y["max"]
    assert "value '/encoder/block.0/layer.0/mm', held in float16" in early.text

    markers = list(next(chart.iter("g", data_series="findings")).iter("path"))
    assert any("error" in m.classes() and "PA901" in m.attrs["data-rules"].split() for m in markers)
    assert len(list(next(chart.iter("g", data_series="norms")).iter("path"))) == 49
    (first,) = list(chart.iter("g", data_series="first-nonfinite"))
    pa906 = next(r["node_name"] for r in report["results"] if r["rule_id"] == "PA906")
    assert first.attrs["data-node"] == pa906 == "/encoder/block.17/layer.1/Mul"
    assert f"first inf/NaN: {pa906}" in first.text

    variance = next(root.iter("svg", **{"class": "chart variance"}))
    columns = list(variance.iter("g", **{"class": "norm-col ok"}))
    assert len(columns) == 49 and all(len(list(c.iter("line", **{"class": "eps"}))) == 1 for c in columns)


def test_static_report_shows_findings_and_the_dtype_map(tmp_path):
    model = t5_like(tmp_path / "t5.onnx", blocks=4)
    code, page, root = render(model, tmp_path, "--keep-fp32", "/encoder/block.3/*")
    assert code == 0
    assert_self_contained(page, root)
    assert not list(root.iter("svg", **{"class": "chart headroom"}))  # nothing was traced
    rows = list(next(root.iter("table", id="findings-table")).iter("tr"))[1:]
    assert len(rows) == 2 * (3 * 2 + 1)  # PA102 and PA208 at the norms of blocks 0-2 and the final norm
    strip = next(root.iter("g", data_series="dtypes"))
    columns = [c for c in strip.children if c.tag == "g"]
    assert len(columns) == len(onnx.load(str(model)).graph.node)
    assert {c.attrs["data-dtype"] for c in columns} == {"fp16", "fp32"}
    classes = [[td.text for td in tr.iter("td")] for tr in next(root.iter("table", **{"class": "dtypes"})).iter("tr")][1:]
    assert classes[0][:3] == ["float16", "--dtype fp16: float32 tensors run as float16", "53"]
    assert classes[1][:3] == ["float32", "kept in float32 by --keep-fp32 /encoder/block.3/*", "16"]
    # the final norm's two readers of the kept block's output read it as the converter casts it back: float16
    assert ["float16", "made by '/encoder/block.3/layer.1/Add', kept in float32 by --keep-fp32 /encoder/block.3/*; "
            "the converter casts its output to float16 for '/encoder/final_layer_norm/Pow' (Pow), which it converts",
            "2"] in [row[:3] for row in classes]
    assert classes[1][4] == "encoder.block.3.layer.{0,1}.layer_norm, encoder.block.3.layer.{0,1}"


HOSTILE = '<script>alert(1)</script>"><img src=http://evil.example/x.png onerror=alert(2)>\u202e&amp;'


def test_hostile_names_are_escaped(tmp_path):
    folder = tmp_path / "<b>dir"
    folder.mkdir()
    model = t5_like(folder / "m<i>.onnx", blocks=1, prefix="/" + HOSTILE, growth=1.0)
    code, page, root = render(model, tmp_path, "--trace")
    assert code == 0
    assert_self_contained(page, root)
    assert "<script>alert" not in page and "<img" not in page and "<b>dir" not in page
    assert {e.tag for e in root.iter()} <= {"#root", "html", "head", "meta", "title", "style", "body", "header", "h1",
                                            "h2", "h3", "p", "b", "i", "div", "nav", "a", "section", "dl", "dt", "dd",
                                            "span", "table", "thead", "tbody", "tr", "th", "td", "br", "small", "code",
                                            "select", "option", "label", "input", "svg", "g", "rect", "line", "path",
                                            "text", "tspan", "circle", "details", "summary", "sub", "sup", "script"}
    shown = "/<script>alert(1)</script>\"><img src=http://evil.example/x.png onerror=alert(2)>\\u202e&amp;"
    rows = list(next(root.iter("table", id="findings-table")).iter("tr"))[1:]
    assert rows and all(r.attrs["data-node"].startswith(shown + "/") for r in rows)
    bands = list(next(root.iter("g", data_series="values")).iter("rect"))
    assert any(shown in b.text for b in bands)  # the tooltip names the node, escaped
    assert "\u202e" not in page  # a bidi override would reorder what the page shows
    assert re.search(r"<h2>Headroom: [^<]*&lt;b&gt;dir/m&lt;i&gt;\.onnx</h2>", page)


def test_more_values_than_pixels_are_aggregated_by_scope(tmp_path):
    model = t5_like(tmp_path / "deep.onnx", blocks=100)  # 100 × 2 × 8 + 7 = 1,607 values, over 1,500
    _code, _page, root = render(model, tmp_path, "--trace", "--select", "PA102")
    notes = [p.text for p in root.iter("p") if "aggregated" in p.classes()]
    assert notes[0].startswith("1,607 values are more than the chart has pixels (over 1,500): they are drawn as ")
    assert "aggregated by module scope" in notes[0]
    bands = list(next(root.iter("g", data_series="values")).iter("rect"))
    assert 100 <= len(bands) <= 1500
    assert any(b.text.startswith("encoder.block.42.layer.1") for b in bands)  # a mark names its scope


def test_each_model_gets_its_charts_when_audited_in_parallel(tmp_path):
    a = t5_like(tmp_path / "a.onnx", blocks=1)
    b = t5_like(tmp_path / "b.onnx", blocks=2, prefix="/decoder")
    out = tmp_path / "report.html"
    assert main([str(a), str(b), "--trace", "-j", "2", "--format", "html", "-o", str(out)]) == 0
    root = parse(out.read_text(encoding="utf-8"))
    headings = [h.text for h in root.iter("h2")]
    assert headings == ["Summary", f"Headroom: {a}", f"Headroom: {b}", "Findings", f"Compute dtypes: {a}",
                        f"Compute dtypes: {b}"]
    charts = list(root.iter("svg", **{"class": "chart headroom"}))
    assert [len(list(next(c.iter("g", data_series="values")).iter("rect"))) for c in charts] == [2 * 8 + 7, 4 * 8 + 7]
    assert {r.attrs["data-model"] for r in list(next(root.iter("table", id="findings-table")).iter("tr"))[1:]} == \
        {str(a), str(b)}


@pytest.mark.slow
def test_every_fixture_case_renders(tmp_path):
    """Every rule's models, traced where their case traces: odd eps (NaN, negative, inf), control flow, no floats."""
    from tests.test_fixtures import EXAMPLES

    cases = {(e.module, e.case.name): e.case for e in EXAMPLES}  # once each: the engine does not change the page
    for i, ((module, _), case) in enumerate(cases.items()):
        folder = tmp_path / str(i)
        folder.mkdir()
        model = case.build(folder)
        out = folder / "report.html"
        head = ["train", str(model)] if case.command == "train" else [str(model), "--dtype", case.dtype]
        code = main([*head, *case.args, "--format", "html", "-o", str(out)])
        assert code in (0, 1), (module, case.name)
        page = out.read_text(encoding="utf-8")
        root = parse(page)
        assert_self_contained(page, root)
        rows = list(next(root.iter("table", id="findings-table")).iter("tr"))[1:] if case.expect else []
        assert {(r.attrs["data-rule"], r.attrs["data-node"]) for r in rows} == case.expect, (module, case.name)


def _train_page(tmp_path: Path, spec: str, *args: str) -> tuple[int, str, Element]:
    out = tmp_path / "train.html"
    code = main(["train", spec, "--trace", *args, "--format", "html", "-o", str(out)])
    page = out.read_text(encoding="utf-8")
    return code, page, parse(page)


@pytest.mark.slow  # a PyTorch capture or training step: seconds
def test_training_report_charts_each_parameters_gradient_against_the_window(tmp_path):
    """A mean cross-entropy weighted 1e-9 under amp-fp16: every parameter's gradient drawn at GradScaler's 2^16,
    each losing elements to 0 there, and the window's lowest-kept level where its smallest scale puts it."""
    from fixtures.train_models import aux_loss_1e_9, spec
    from precaudit.train.factory import setup_of
    from precaudit.train.regimes import REGIMES
    from precaudit.train.step import run_steps

    code, page, root = _train_page(tmp_path, spec("aux_loss_1e_9"))
    assert code == 0  # PA451 and PA453 are warnings
    assert_self_contained(page, root)
    (section,) = root.iter("section", id="gradients-0")
    bands = list(next(section.iter("g", data_series="values")).iter("rect"))
    assert [b.attrs["data-node"] for b in bands] == ["embed.weight", "head.weight", "head.bias"]
    assert all("under" in b.classes() for b in bands)
    smallest, _ = run_steps(setup_of("aux", aux_loss_1e_9()), REGIMES["amp-fp16"]).window
    (bottom,) = section.iter("g", data_limit="window-bottom")
    assert float(bottom.attrs["data-value"]) == pytest.approx(2.0 ** -24 * 2.0 ** 16 / smallest, rel=1e-5)
    markers = {m.attrs["data-rules"] for m in section.iter("path") if "marker" in m.classes()}
    assert markers == {"PA451"}  # one per parameter, each PA451
    assert "GradScaler starts at 2^16" in section.text


# torch refuses a module name with a dot, and torch.fx's generated code one with a quote or a bidi override
_NO_DOTS = "<script>alert(1)</script><img src=x onerror=alert(2)>&amp;"


@pytest.mark.slow  # a PyTorch capture or training step: seconds
def test_training_report_escapes_the_models_names(tmp_path):
    factory = tmp_path / "hostile.py"
    factory.write_text(
        "import torch\nfrom torch import nn\n\n"
        "def make():\n"
        "    torch.manual_seed(0)\n"
        "    model = nn.Sequential()\n"
        f"    model.add_module({_NO_DOTS!r}, nn.Linear(8, 1))\n"
        "    return model, torch.randn(4, 8), lambda out: out.square().mean()\n")
    code, page, root = _train_page(tmp_path, f"{factory}:make")
    assert code == 0
    assert_self_contained(page, root)
    assert "<script>alert" not in page and "<img" not in page
    (section,) = root.iter("section", id="gradients-0")
    bands = list(next(section.iter("g", data_series="values")).iter("rect"))
    shown = _NO_DOTS
    assert [b.attrs["data-node"] for b in bands] == [shown + ".weight", shown + ".bias"]


def test_a_notebook_gets_a_fragment_whose_styles_touch_only_itself(tmp_path):
    """Report._repr_html_: one element, no <html>/<head>/<body>, no script, and every CSS selector inside the
    fragment's own container (the page's :root, body, h1 and table rules restyled the whole notebook)."""
    import re

    import precaudit
    from fixtures.onnx_builders import decomposed_layernorm, save

    report = precaudit.audit(save(decomposed_layernorm(1e-12, dtype="fp32")[0], tmp_path / "ln.onnx"))
    html = report._repr_html_()
    assert html.startswith('<div class="precaudit-report"><style>') and html.rstrip().endswith("</div>")
    assert not re.search(r"<(html|head|body|script)\b", html)
    css = html[html.index("<style>") + 7:html.index("</style>")]
    selectors = [s.strip() for block in css.split("}") if "{" in block for s in block.split("{")[0].split(",")]
    assert selectors and all(s == ".precaudit-report" or s.startswith(".precaudit-report ") for s in selectors)
    assert "PA101" in html and report.to_html().startswith("<!DOCTYPE html>")


@pytest.mark.requires("torch")
def test_a_converted_hf_rmsnorm_is_told_what_helps(tmp_path):
    """transformers' LlamaRMSNorm upcasts to float32 before the variance already: exported in float32, that Cast is
    a no-op, and converting the model to float16 converts it too. The advice is to keep the norm in float32 in the
    conversion (the converter's block list), not to write the upcast it has."""
    import torch
    from torch import nn

    from fixtures.torch_exports import HFRMSNorm

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = HFRMSNorm(1e-6, upcast=True)

        def forward(self, x):
            return self.norm(x)

    model = tmp_path / "llama_norm.onnx"
    torch.onnx.export(Block().eval(), (torch.randn(2, 8),), str(model), dynamo=False, opset_version=17)
    code, _, root = render(model, tmp_path, "--dtype", "fp16")
    rows = list(next(root.iter("table", id="findings-table")).iter("tr"))[1:]
    fixes = {row.attrs["data-rule"]: next(row.iter("div", **{"class": "fix"})).text for row in rows}
    assert (code, sorted(fixes)) == (0, ["PA102", "PA208"])
    assert fixes["PA208"] == (
        "fix: Keep the statistic in float32. Converting a float32 export to float16 (--dtype, a converter) converts "
        "a Cast to float32 before it too (HF Llama/T5 RMSNorm's x.float()): keep this norm out of the conversion "
        "(precaudit keep-list prints your converter's block list). In a model exported in float16, cast before the "
        "statistic (x.float().pow(2).mean(...)), or use the fused op (nn.LayerNorm / nn.RMSNorm export with "
        "stash_type=1).")
