"""Materialize a trajectory's text on demand, deterministically and at exact token counts.

Every text is a pure function of (root seed, content salt, agent id, field, turn, size) and
the tokenizer, so it never depends on which worker generated it or when. The size defaults
to the plan; the driver passes another size when it corrects a prompt towards its target.
"""

from __future__ import annotations

from batchbench.errors import SynthesisError
from batchbench.plan.workload import Workload
from batchbench.rng import content_root, mix_seed
from batchbench.text.synth import Synthesizer

STREAM_INITIAL_TEXT = 0x1000_0000_0000_0000
STREAM_RESET_TEXT = 0x2000_0000_0000_0000
STREAM_ENVIRONMENT_TEXT = 0x2000_0000_0000_0001


class ContentFactory:
    """Text for the initial prompt, the environment replies and reset prompts of each agent."""

    def __init__(
        self, synth: Synthesizer, workload: Workload, root_seed: int, salt: str = ""
    ) -> None:
        self.synth = synth
        self.workload = workload
        self.root_seed = root_seed
        self.salt = salt
        self._text_root = content_root(root_seed, salt)

    def _text(self, tokens: int, agent: int, stream: int, context: str, detail: str) -> str:
        try:
            return self.synth.text(tokens, mix_seed(self._text_root, agent, stream))
        except SynthesisError as exc:
            raise exc.with_context(detail).with_context(context) from None

    def initial_prompt(self, agent: int, tokens: int | None = None) -> str:
        """The first user message: ``input_content_tokens`` of request 1 unless sized."""
        request = self.workload.turns(agent)[0]
        if tokens is None:
            tokens = int(self.workload.input_content_tokens[request])
        ident = self.workload.trajectory_ids[agent]
        return self._text(
            tokens,
            agent,
            STREAM_INITIAL_TEXT,
            f'failed to generate initial prompt for trajectory "{ident}"',
            f"request 1 field input_content_tokens ({tokens})",
        )

    def environment(self, agent: int, turn: int, tokens: int | None = None) -> str:
        """The tool result appended after turn ``turn`` (0-based) succeeds."""
        request = self.workload.turns(agent)[turn]
        if tokens is None:
            tokens = int(self.workload.environment_tokens[request])
        ident = self.workload.trajectory_ids[agent]
        return self._text(
            tokens,
            agent,
            STREAM_ENVIRONMENT_TEXT + 2 * turn,
            f'failed to generate environment content for trajectory "{ident}" '
            f"invocation {turn + 1}",
            f"request {turn + 1} field environment_tokens ({tokens})",
        )

    def reset_prompt(self, agent: int, turn: int, tokens: int | None = None) -> str:
        """The single user message that replaces the history before reset turn ``turn``."""
        request = self.workload.turns(agent)[turn]
        if tokens is None:
            tokens = int(self.workload.input_content_tokens[request])
        ident = self.workload.trajectory_ids[agent]
        return self._text(
            tokens,
            agent,
            STREAM_RESET_TEXT + 2 * turn,
            f'failed to prefetch reset prompt for trajectory "{ident}" invocation {turn + 1}',
            f"request {turn + 1} field input_content_tokens ({tokens})",
        )
