"""precaudit train on transformers GPT-2, Llama, BERT and T5 (small random-init configs, with labels) in all four
regimes: which rules fire where, static and traced, as a Markdown table.

Each model is built from its config with tiny sizes (seed 0), called with labels so it returns its loss, and given
AdamW(lr 2e-5, weight_decay 0.01) — a fine-tuning learning rate, where pure-bf16 weights lose their updates. Each
(model, regime) is audited with `precaudit.train_audit(..., trace=True)` on a batch of 2 x 32 tokens drawn with
seed 0 (the audit's traced numbers come from that batch). The table lists the rule ids that fire with their counts;
`--write FILE` replaces the table between the markers in FILE (README.md and docs/training.md carry it), `--check
FILE` exits 1 when FILE's table differs from a rerun.

    python benchmarks/train_sweep.py [--write README.md --write docs/training.md] [--check README.md]
"""

from __future__ import annotations

import argparse
import collections
import sys
import time
from pathlib import Path

START, END = "<!-- train-sweep:start -->", "<!-- train-sweep:end -->"
REGIMES = ("amp-fp16", "amp-bf16", "bf16", "fp16")
LR = 2e-5


def build(name: str):
    """(model, inputs, optimizer) for one architecture."""
    import torch
    import transformers as tf

    torch.manual_seed(0)
    small = dict(vocab_size=256, pad_token_id=0, bos_token_id=0, eos_token_id=1)
    if name == "GPT-2":
        model = tf.GPT2LMHeadModel(tf.GPT2Config(n_embd=64, n_layer=2, n_head=2, n_positions=64, **small))
    elif name == "Llama":
        model = tf.LlamaForCausalLM(tf.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                                   num_attention_heads=2, num_key_value_heads=2,
                                                   max_position_embeddings=64, **small))
    elif name == "BERT":
        model = tf.BertForMaskedLM(tf.BertConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                                 num_attention_heads=2, max_position_embeddings=64, **small))
    elif name == "T5":
        model = tf.T5ForConditionalGeneration(tf.T5Config(d_model=64, d_kv=32, d_ff=128, num_layers=2, num_heads=2,
                                                          decoder_start_token_id=0, **small))
    else:
        raise ValueError(name)
    ids = torch.randint(2, 256, (2, 32))
    batch = {"input_ids": ids, "labels": ids.clone()}
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.01)
    return model, batch, optimizer


MODELS = ("GPT-2", "Llama", "BERT", "T5")


def cell(report) -> str:
    if report.errors:
        return "error: " + str(report.errors[0]).replace("|", "\\|")[:80]
    counts = collections.Counter(f.rule_id for f in report.findings)
    return " ".join(f"{rule}×{n}" if n > 1 else rule for rule, n in sorted(counts.items())) or "–"


def table() -> tuple[str, float]:
    import precaudit

    start = time.perf_counter()
    rows = []
    for name in MODELS:
        cells = []
        for regime in REGIMES:
            model, batch, optimizer = build(name)
            cells.append(cell(precaudit.train_audit(model, batch, None, optimizer, regime=regime, trace=True)))
        rows.append(f"| {name} | " + " | ".join(cells) + " |")
    head = "| model | " + " | ".join(f"`{r}`" for r in REGIMES) + " |\n|---|" + "---|" * len(REGIMES)
    return head + "\n" + "\n".join(rows), time.perf_counter() - start


def block(text: str) -> str:
    return f"{START}\n{text}\n{END}"


def replaced(path: Path, text: str) -> str:
    source = path.read_text()
    if START not in source or END not in source:
        raise SystemExit(f"{path}: no {START} ... {END} markers to put the table between")
    head, rest = source.split(START, 1)
    return head + block(text) + rest.split(END, 1)[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", type=Path, action="append", default=[])
    parser.add_argument("--check", type=Path, action="append", default=[])
    args = parser.parse_args()
    text, seconds = table()
    print(text)
    print(f"({len(MODELS) * len(REGIMES)} traced audits in {seconds:.0f} s)")
    for path in args.write:
        path.write_text(replaced(path, text))
        print(f"wrote {path}")
    stale = [path for path in args.check if replaced(path, text) != path.read_text()]
    for path in stale:
        print(f"{path}: its table differs from this run")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
