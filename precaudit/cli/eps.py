"""`precaudit eps MODEL`: every eps and floor with its value where it is used; `--diff OLD NEW` what changed."""

from __future__ import annotations

from .given import EXIT_CLEAN, Given, UsageError
from .output import note_named_inputs, say_notes, write

__all__ = ["eps"]


def eps(given: Given) -> int:
    from ..context import Audit
    from ..eps_inventory import (
        diff_inventories,
        eps_inventory,
        render_diff_json,
        render_diff_text,
        render_inventory_json,
        render_inventory_text,
    )

    models = given.models
    if len(models) != (2 if given.diff else 1):
        raise UsageError("eps takes one MODEL, or two with --diff (OLD.onnx NEW.onnx)")
    settings = given.settings()
    note_named_inputs(models, settings, [])
    audit = Audit.of(settings, given.torch_options())
    say_notes(audit)
    json_out = given.output_format == "json"
    if given.diff:
        old, new = (eps_inventory(audit, m)[1] for m in models)
        changes = diff_inventories(old, new)
        render = render_diff_json if json_out else render_diff_text
        write(render(models[0], models[1], changes), given.output)
        return EXIT_CLEAN
    _, entries = eps_inventory(audit, models[0])
    write((render_inventory_json if json_out else render_inventory_text)(models[0], entries), given.output)
    return EXIT_CLEAN
