"""Why a run's prompt fidelity is below 100 %: one line, diagnosed from the drifts the run
recorded, that names the fix.

The causes it tells apart, in this order:

* the server sent no usage: no prompt was measured;
* ``--no-prompt-correction``: the plan's sizes went unchanged, framing and replies drift;
* the correction ran out of room (its own line says so: no cause line then);
* the run started from framing overheads other than the server's (no calibration: it was
  off or failed; or wrong ``--replay-*-overhead-tokens``): only the requests before the
  run learned the right ones drifted; the line names the flags with the server's values;
* otherwise the drift is irregular: the server counts tokens or renders the template
  differently from this run's tokenizer and template.

Output fidelity below 100 % has a cause line when the replies were shorter than planned
(the model stopped at EOS: ``--ignore-eos``; or the server ignored the token fields it was
sent: ``--sglang`` names them as SGLang does) or longer (the server ignored max_tokens).
"""

from __future__ import annotations

from typing import Any

from batchbench.results.recording import FidelityFigures


def prompt_fidelity_cause(
    fidelity: FidelityFigures,
    framing: dict[str, Any] | None,
    *,
    no_usage: bool,
    prompt_correction: bool,
    calibrate: bool | None,
    calibrated: bool,
    calibration_check_ok: bool | None,
    calibration_note: str | None,
    started_from: tuple[int, int],
    flags: tuple[int | None, int | None],
    tokenizer: str | None,
    chat_template: str | None,
) -> str | None:
    """The cause line under ``Prompt fidelity:`` (None at 100 %, or when another line
    already says why). ``started_from`` is the (initial, turn) framing the run started
    from; ``flags`` the --replay-*-overhead-tokens values given (None: not given);
    ``calibration_check_ok`` the calibration's check (None: no calibration): a calibration
    that mispredicted its own check conversation means the counts differ, not the framing."""
    prompt = fidelity.prompt
    if not prompt.requests:
        if not no_usage:
            return None
        return (
            "cause: the server sent no usage.prompt_tokens, so no prompt was measured or "
            "corrected: have it report usage (a server that reports it only on plain replies: "
            "--no-stream)"
        )
    inexact = prompt.requests - prompt.exact
    if not inexact:
        return None
    if not prompt_correction:
        return (
            "cause: --no-prompt-correction sends the plan's sizes unchanged, so neither the "
            "server's framing nor its replies as the template renders them are accounted for "
            "(drop --no-prompt-correction for exact prompts)"
        )
    if fidelity.limited_requests >= inexact:
        return None  # "Prompt correction could not reach the target ..." says why
    if framing is not None and calibration_check_ok is not False:
        learned = (framing["initial_overhead_tokens"], framing["turn_overhead_tokens"])
        if learned != started_from:
            return _framing_cause(
                learned, started_from, calibrate, calibrated, calibration_note, flags
            )
    template = f" and the {chat_template} template" if chat_template else ""
    return (
        "cause: the server counts prompts differently from this run's tokenizer"
        f"{template} (--tokenizer-model {tokenizer}): give the server's own tokenizer.json "
        "with --tokenizer-model (and its template with --chat-template)"
    )


def _framing_cause(
    learned: tuple[int, int],
    started: tuple[int, int],
    calibrate: bool | None,
    calibrated: bool,
    calibration_note: str | None,
    flags: tuple[int | None, int | None],
) -> str:
    names = ("initial", "turn")
    options = ("--replay-initial-overhead-tokens", "--replay-turn-overhead-tokens")
    differ = [k for k in (0, 1) if learned[k] != started[k]]
    what = ", ".join(f"{names[k]} {learned[k]}" for k in differ)
    before = " and ".join(str(started[k]) for k in differ)
    given = [k for k in differ if flags[k] is not None]
    reasons = []
    if given:
        reasons.append("the given " + " and ".join(options[k] for k in given) + " differ")
    fix = "give " + " ".join(f"{options[k]} {learned[k]}" for k in differ)
    if len(given) < len(differ):
        if calibrate is False:
            reasons.append("calibration was off (--no-calibrate)")
            fix = "drop --no-calibrate, or " + fix
        elif calibration_note is not None:
            reasons.append("calibration failed (see the note above)")
        elif calibrated:
            reasons.append("the calibration did not predict it")
        else:
            reasons.append("the run was not calibrated")
    why = "; ".join(reasons)
    return (
        f"cause: the server frames prompts with {what} overhead tokens, not the {before} the "
        f"run started from (learned after its first requests): {why}; {fix}"
    )


def output_fidelity_cause(
    fidelity: FidelityFigures, *, ignore_eos: bool, sglang: bool
) -> str | None:
    """The cause line under ``Output fidelity:`` (None at 100 % or with no request)."""
    histogram = fidelity.output.histogram
    short = sum(count for drift, count in histogram.items() if drift < 0)
    long = sum(count for drift, count in histogram.items() if drift > 0)
    fields = "min_new_tokens/max_new_tokens" if sglang else "min_tokens/max_tokens"
    other = "without --sglang" if sglang else "an SGLang server needs --sglang"
    if short and not long:
        if not ignore_eos:
            return (
                f"cause: {short} replies ended before their planned length (the model stopped "
                "at end of sequence): give --ignore-eos so the server generates every planned "
                "token"
            )
        return (
            f"cause: {short} replies ended before their planned length although ignore_eos "
            f"was sent: the server ignores {fields} ({other})"
        )
    if long and not short:
        return (
            f"cause: {long} replies ran past their planned length: the server ignores "
            f"{fields} ({other})"
        )
    if short or long:
        return (
            f"cause: {short} replies were shorter and {long} longer than planned: the server "
            f"does not honour {fields} ({other}){'' if ignore_eos else '; give --ignore-eos'}"
        )
    return None
