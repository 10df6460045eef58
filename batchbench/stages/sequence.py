"""The stages composed: one process's run of ``config``, start to end."""

from __future__ import annotations

from dataclasses import replace

from batchbench.config import RunConfig
from batchbench.errors import BatchbenchError, UsageError
from batchbench.stages.admission import start_at_gate
from batchbench.stages.console import RunOutput, Silent
from batchbench.stages.execute import execute
from batchbench.stages.finish import RunResult, finish
from batchbench.stages.hosting import Hosting
from batchbench.stages.outputs import write_outputs
from batchbench.stages.plans import load_plans
from batchbench.stages.prepare import prepare
from batchbench.stages.target import resolve_target


def check_run(config: RunConfig) -> None:
    """Everything about ``config`` that can fail before anything runs."""
    config.check_once()
    if config.report_html:
        from batchbench.report import require_plotly  # lazy: only with --report-html

        try:
            require_plotly()  # before the run: a missing extra is known now, not at the end
        except BatchbenchError as exc:
            raise UsageError(str(exc)) from None


async def run_stages(config: RunConfig, output: RunOutput | None, hosting: Hosting) -> RunResult:
    """Plans, target, preparation, execution, result and files, in this process."""
    check_run(config)
    out = output if output is not None else Silent()
    plans = await load_plans(config, out, hosting.call)
    target = await resolve_target(config, out, hosting.call)
    try:
        config = target.config
        if hosting.gate is None and config.start_at is not None:
            hosting = replace(hosting, gate=start_at_gate(config.start_at, out.warning))
        prepared = await prepare(config, plans, out, hosting.call, target.layout)
        executed = await execute(prepared, out, hosting)
        return write_outputs(finish(prepared, executed), out)
    finally:
        if target.sim is not None:
            target.sim.stop()
