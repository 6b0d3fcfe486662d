"""One audit's context, resolved once from the settings: the rules, the deployment target, and how models are loaded
and run. Every command (check, match, keep-list, fix, train) and every API function is a thin function over it."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .deployment import Deployment
from .errors import InputError
from .options import TorchOptions, TraceOptions

if TYPE_CHECKING:
    from .config import Settings
    from .finding import Finding
    from .ir import Graph
    from .rules.engine import Match
    from .rules.loader import Rule

__all__ = ["Audit"]


@dataclass
class Audit:
    """What one run needs besides the models: made by Audit.of(settings, ...) from the configuration file, the
    command line or the API's arguments (load_settings resolves the three the same way)."""

    settings: Settings
    deployment: Deployment
    all_rules: list[Rule]  # the built-in rules and the user's (--rules), selected or not
    rules: list[Rule]  # the rules this run applies (--select, --ignore, --preview)
    torch: TorchOptions = field(default_factory=TorchOptions)
    # how a run gets its inputs (.npz files or synthesized, dims, engine, timeout); traced: whether check and
    # keep-list run the model (fix always reads inputs, for its float32 check)
    inputs: TraceOptions = field(default_factory=TraceOptions)
    traced: bool = False

    @classmethod
    def of(cls, settings: Settings, torch: TorchOptions | None = None, inputs: TraceOptions | None = None,
           traced: bool = False) -> Audit:
        """Resolve the settings once: the target dtype and converter, the rules loaded and every selector checked
        (an error names the flag or the pyproject key that gave it)."""
        from .rules.loader import load_rules
        from .selection import active_rules

        if settings.runtime == "all":
            raise InputError(None, f"{settings.named('runtime')} all: the deployment matrix is check's (precaudit "
                                   "check MODEL --runtime all); this command judges one runtime at a time")
        try:
            deployment = Deployment.named(settings.dtype, settings.converter, settings.keep_fp32, settings.runtime)
        except (KeyError, ValueError) as exc:  # load_settings checked them: reached only through a Settings by hand
            raise InputError(None, str(exc.args[0])) from None
        all_rules = load_rules(settings.rules)
        _check_selectors(settings, all_rules)
        rules = active_rules(all_rules, settings.selected, settings.ignored, settings.preview)
        torch = torch or TorchOptions()
        if torch.autocast is None and settings.autocast is not None:
            torch = dataclasses.replace(torch, autocast=settings.autocast)
        return cls(settings, deployment, all_rules, rules, torch, inputs or TraceOptions(), traced)

    @property
    def notes(self) -> list[str]:
        """What the run should say besides its findings: a runtime version judged as the nearest modelled one."""
        runtime = self.deployment.runtime
        if runtime is None or runtime.asked is None:
            return []
        return [f"{runtime.name}@{runtime.asked} is not a modelled version: judged as {runtime.spelled}, the nearest "
                f"modelled version not after it (modelled: {', '.join(type(runtime).versions)})"]

    @property
    def trace(self) -> TraceOptions | None:
        """The traced mode's options when the run is traced."""
        return self.inputs if self.traced else None

    @property
    def dims(self) -> dict[str, int]:
        """The sizes given to symbolic dims (--dim): the static pass bounds what they make too."""
        return self.inputs.dims

    def ignored(self, findings: list[Finding]) -> list[Finding]:
        """The findings left after the pyproject's per-model and per-node ignores (inline suppressions are the
        static pass's own)."""
        from .selection import drop_ignored

        settings = self.settings
        return drop_ignored(findings, {r.id: r for r in self.rules}, settings.per_model_ignores,
                            settings.per_node_ignores, settings.project_root)

    def load(self, path: str, strict_dims: bool = True) -> Graph:
        """The model's graph, by the frontend its path names, with the --dim sizes."""
        from .audit_models import load_graph

        self.deployment.check_runs(path)
        return load_graph(path, self.torch, self.deployment.fmt.name, self.dims, strict_dims)

    def static(self, graph: Graph, path: str, weights: bool = False,
               keep: Callable[[list[Finding]], list[Finding]] | None = None) -> list[Match]:
        """The static pass over one graph at this deployment: every finding with its rule and site, less the
        inline suppressions and the configured ignores."""
        from .audit_models import static_matches

        return static_matches(graph, self.deployment.resolver(graph), self.rules, path, weights,
                              keep if keep is not None else self.ignored)


def _check_selectors(settings: Settings, rules: list[Rule]) -> None:
    """Every selector must name a rule; the error names the flag, or the pyproject file and key."""
    from .selection import check_selectors

    for name in ("select", "ignore", "extend_select", "extend_ignore"):
        origin = settings.origins.get(name)
        if origin == "command line":
            check_selectors(getattr(settings, name), rules, None, settings.named(name))
        else:
            check_selectors(getattr(settings, name), rules, origin, f"[tool.precaudit] {name.replace('_', '-')}")
    for table in ("per_model_ignores", "per_node_ignores"):
        for glob, selectors in getattr(settings, table).items():
            key = f"[tool.precaudit] {table.replace('_', '-')}.\"{glob}\""
            check_selectors(selectors, rules, settings.config_file, key)
