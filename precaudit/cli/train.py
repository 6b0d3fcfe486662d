"""`precaudit train FACTORY`: audit a PyTorch training step in an fp16/bf16 regime."""

from __future__ import annotations

import os

from .given import Given
from .output import say, write_report

__all__ = ["train"]


def train(given: Given) -> int:
    """Audit a PyTorch training step (precaudit/train): the backward pass, the loss scale, the optimizer step."""
    from ..context import Audit
    from ..files import check_output, note_read
    from ..frontends.torch_input import torch_input_files
    from ..pipeline import run_train_audit
    from ..train.audit import TrainOptions

    model, output = given.model, given.output
    if output is not None:
        for file in torch_input_files(model) if not os.path.lexists(model) else [model]:
            note_read(file)
        check_output(output, null_ok=True)
    options = TrainOptions(regime=given.regime, trace=given.trace, steps=given.steps, seed=given.seed,
                           loss_scale=given.loss_scale, lr=given.lr, timeout=given.timeout)
    options.validate()  # before the configuration: a bad option is the first thing said
    # the [tool.precaudit] table under the flags, as check reads it: rules, selectors, ignores, baseline, fail-on
    audit = Audit.of(given.settings())
    outcome = run_train_audit(model, options, debug=given.debug, audit=audit)
    outcome.settings["format"] = given.report_format or "text"
    for err in outcome.result.errors:
        say(str(err))
    write_report(outcome, output, given.no_color)
    return outcome.exit_code
