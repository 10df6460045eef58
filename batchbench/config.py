"""The resolved configuration of one run, built at the command-line edge."""

from __future__ import annotations

from dataclasses import dataclass

from batchbench.plan.workload import SampledShape


@dataclass
class RunConfig:
    """What every later stage needs to know; raw flag values are kept for the CSV."""

    model: str
    tokenizer_model: str
    host: str
    endpoint_url: str
    workload_mode: str  # "synthetic" | "trajectory_replay"
    agents: int
    root_seed: int
    seed_given: int | None
    max_active_requested: int | None
    admission: str = "closed-loop"
    time_scale: float = 1.0
    manifest_path: str | None = None
    manifest_sha256: str | None = None
    initial_overhead: int | None = None
    turn_overhead: int | None = None
    shape: SampledShape | None = None
    sglang: bool = False
    ignore_eos: bool = False
    dp_ranks: int | None = None
    user_tagging: bool = True
    dry_run: bool = False
    results_csv: str | None = None
    agent_events_jsonl: str | None = None
    latency_flags: tuple = (None, None, None, None, None)
    tokenizer_source: str = ""
    schema_version: int | None = None
    content_salt: str = ""
    prompt_correction: bool = True
    prompt_oracle: str = "none"
    chat_template: str | None = None  # the template replies are counted in, when known
    calibration: dict | None = None  # ``Calibration.as_dict()`` when --calibrate ran
    framing_initial: int = 0  # overheads the run starts from (flags, calibration or 0)
    framing_turn: int = 0
    framing_measured: bool = False  # from flags or calibration, not a default

    @property
    def effective_max_active(self) -> int:
        requested = self.max_active_requested
        return self.agents if requested is None else min(requested, self.agents)
