"""Follow the driver log of a NeMo RL GRPO Ray job: task-log lines and per-step metrics (the checkpoint saves too).

The Ray Jobs API hands the sensor the driver log either whole (``GET /api/jobs/{id}/logs``) or in chunks.
:class:`LogFollower` turns that text into the lines worth showing in the Airflow task log (progress bars collapsed,
colour codes removed) and feeds every line to :class:`RunMetrics`, which reads the per-step summaries NeMo RL
prints. The formats come from NeMo RL's own print calls at v0.5.0 and v0.7.0:

* ``nemo_rl/algorithms/grpo.py``: ``===== Step k/K =====``, ``📊 Training Results:``, ``⏱️  Timing:``,
  ``📊 Validation Results:``, ``▶ Starting validation at step N...``, ``Saving checkpoint for step N...``;
* ``nemo_rl/algorithms/utils.py`` ``print_performance_metrics``: ``🔍 Performance Metrics:`` and the
  ``- <group> (Tokens/sec/gpu): x`` throughput lines.

:func:`nemo_rl_gke.observe.zero_learning.check_zero_learning` decides from the parsed steps whether the run can
learn at all; :mod:`nemo_rl_gke.observe.step_timing` bounds how long a step may take.

Pure and stdlib-only (the triggerer imports it) and log-free: callers decide what to log. Every pattern runs in
linear time on any line (no two quantifiers can share characters, or the first is possessive), lines longer than
:data:`MAX_PARSE_CHARS` are shown but never parsed, and numbers too long to be NeMo RL's are ignored, so a hostile
driver log can neither stall the triggerer nor make the follower raise.
"""

from __future__ import annotations

import math
import re
from collections import deque
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from nemo_rl_gke.observe.redaction import StreamRedactor

# ---------------------------------------------------------------------------------------------------------------
# Line decorations: ANSI colours, Ray's actor prefix and its de-duplication suffix
# ---------------------------------------------------------------------------------------------------------------

# CSI (colours), OSC (terminal hyperlinks) and two-character escapes: Ray colours its actor prefixes, wandb its links.
_ANSI_RE = re.compile(r"\x1b(?:\[[0-?]*+[ -/]*+[@-~]|\][^\x07\x1b]*+(?:\x07|\x1b\\)|[@-Z\\-_])")
# Ray's print_worker_logs: "(Name pid=123, ip=10.0.0.5) msg", "(pid=123) msg", "(Name[rank=0] pid=123) msg";
# NeMo RL's workers set __repr__, so Name may be "DTensorPolicyWorker[rank=0]". Also "(raylet)", "(autoscaler +5s)".
_RAY_PREFIX_RE = re.compile(
    r"^\((?:[^()]*? )?pid=\w++(?:, ip=[^()\s]++)?\) ?|^\((?:raylet|autoscaler|gcs_server)\b[^()]*+\) ?"
)
# Ray's log de-duplication: "msg [repeated 7x across cluster]", the first time followed by its advice in parentheses.
# Only the last marker counts, and what follows it is checked with string methods: a pattern searched from every
# position with "\s*" in front (as before) rescanned the line's spaces, quadratic.
_RAY_REPEAT_RE = re.compile(r"\[repeated \d++x across cluster\]")
_RAY_DEDUP_ADVICE = "(Ray deduplicates logs by default"

# ---------------------------------------------------------------------------------------------------------------
# Progress bars (tqdm, vLLM)
# ---------------------------------------------------------------------------------------------------------------

_UNIT_NUM = r"\d++(?:\.\d++)?+[kMGTPEZY]?+"
# tqdm's default "desc:  45%|████▌     | 29/64 [...]" and vLLM's weight loader "desc:  50% Completed | 1/2 [...]":
# the first "N%" that the rest of a bar follows; the description is what precedes it, less spaces and a colon.
# (One pattern with a lazy description and "\s*:?\s*" before the percentage was cubic on a line of spaces.)
_PERCENT_RE = re.compile(r"\d{1,3}%")
_BAR_REST_RE = re.compile(rf"\s*+(?:\|[^|]*+\||Completed\s*+\|)\s*+(?P<n>{_UNIT_NUM})/(?P<total>{_UNIT_NUM})(?![\w.])")
_UNIT_SCALE = {"": 1.0, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18, "Z": 1e21, "Y": 1e24}

# ---------------------------------------------------------------------------------------------------------------
# NeMo RL GRPO markers (grpo.py and utils.py at v0.5.0 and v0.7.0)
# ---------------------------------------------------------------------------------------------------------------

_NUM = r"(?:[-+]?+(?:\d++(?:\.\d*+)?+|\.\d++)(?:[eE][-+]?+\d++)?+|[-+]?+(?i:nan|inf))"
# Step, epoch and checkpoint numbers have at most this many digits; a longer one is not NeMo RL's (and int() would
# refuse one of 4,300 digits).
_INT = r"(\d{1,9})(?!\d)"
# print(f"\n{'=' * 25} Step {current_step + 1}/{min(len(dataloader), max_num_steps)} {'=' * 25}")
_STEP_RE = re.compile(rf"^=++\s*+Step\s++{_INT}\s*+/\s*+{_INT}\s*+=++$")
# print(f"\n{'=' * 25} Epoch {current_epoch + 1}/{max_num_epochs} {'=' * 25}")
_EPOCH_RE = re.compile(rf"^=++\s*+Epoch\s++{_INT}\s*+/\s*+{_INT}\s*+=++$")
# Section headers; the leading emoji (📊, ⏱️, 🔍) are non-word characters, so \W* absorbs them (or their absence).
# "Timing:" alone is the step's; "Validation Timing:" and "Worker Initialization Timing:" do not match it.
_SECTIONS = (
    ("train", re.compile(r"^\W*+Training Results:$")),
    ("timing", re.compile(r"^\W*+Timing:$")),
    ("perf", re.compile(r"^\W*+Performance Metrics:$")),
    ("val", re.compile(r"^\W*+Validation Results:$")),
    ("val_timing", re.compile(r"^\W*+Validation Timing:$")),
)
# print(f"  • Loss: {metrics['loss']:.4f}") and the other "  • Key: value" lines of every section (key and value are
# stripped afterwards: "\s*" around a lazy key was cubic on a line of spaces).
_BULLET_RE = re.compile(r"^•(?P<key>[^:]*+):(?P<value>.*)$")
# print(f"  • Total step time: {total_time:.2f}s")
_SECONDS_RE = re.compile(rf"^(?P<s>{_NUM})s$")
# print(f"  • {k}: {v:.2f}s ({percent:.1f}%)")
_PHASE_RE = re.compile(rf"^(?P<s>{_NUM})s\s*+\(\s*+{_NUM}%\)$")
# print(f"    - E2E (Tokens/sec/gpu): {e2e_tokens_per_sec_per_gpu:.2f}") and the per-group "(Tokens/sec)" lines; the
# name is stripped afterwards (only one "(" can be followed by the rest up to the end, so ".*" backtracks linearly).
_THROUGHPUT_RE = re.compile(
    rf"^-(?P<name>.*)\((?P<unit>Tokens|Samples)/sec(?P<gpu>/gpu)?+\)\s*+:\s*+(?P<value>{_NUM})$"
)
# print(f"▶ Starting validation at step {step}...")
_VAL_START_RE = re.compile(rf"Starting validation at step {_INT}\b")
# print(f"Saving checkpoint for step {total_steps + 1}...")
_CHECKPOINT_RE = re.compile(rf"\bSaving checkpoint for step {_INT}\b")
# print("Timeout has been reached, stopping training early", flush=True): checkpoint_must_save_by was reached (grpo.py
# at v0.5.0 and v0.7.0), after the save it forced.
_TIMEOUT_REACHED = "Timeout has been reached, stopping training early"
# The end of setup() (grpo.py:643-646 at v0.5.0, :1230-1233 at v0.7.0): print(" " * 18 + "SETUP COMPLETE") and
# print(f"  Total setup time: {total_setup_time:.1f}s"). grpo_train starts checkpoint_must_save_by's clock right after.
_SETUP_COMPLETE = "SETUP COMPLETE"
_SETUP_TIME_RE = re.compile(rf"^Total setup time:\s*+(?P<s>{_NUM})s$")
# wandb: "wandb: 🚀 View run at https://..." when the run starts, "wandb: 🚀 View run <name> at: https://..." when it
# finishes; the emoji is dropped on terminals without them, the URL host differs on a self-hosted server. Three
# searches, not one pattern with two lazy gaps (which rescanned the line once per "View run": quadratic).
_WANDB_RE = re.compile(r"wandb:\s")
_VIEW_RUN_RE = re.compile(r"\bView run\b")
_URL_RE = re.compile(r"https?://\S++")
# A W&B run URL is under 100 characters; a longer one is not shown (it would be the biggest part of the job event).
_MAX_URL_CHARS = 512

_TRAIN_KEYS = {
    "Loss": "loss",
    "Generation KL Error": "kl_error",
    "Avg Reward": "avg_reward",
    # With dynamic sampling NeMo RL prints the batch mean as "Avg Total Reward" and the kept groups' as "Filtered".
    "Avg Total Reward": "avg_reward",
    "Avg Filtered Reward": "avg_filtered_reward",
    "Mean Generation Length": "mean_gen_length",
}

# A line without any terminator is cut into pieces this long, so a runaway line cannot grow the buffer unbounded.
_MAX_SEGMENT_CHARS = 1 << 20
# NeMo RL's marker lines, tqdm bars and W&B's links are far shorter: a longer line is shown (cut) but not parsed.
MAX_PARSE_CHARS = 4096
# NeMo RL prints metrics with a few digits; a longer "number" is not one of them.
_MAX_NUMBER_CHARS = 64
# Progress bars tracked at once (a NeMo RL run has a few per actor); past this the oldest counts as abandoned.
_MAX_BARS = 256
_EOL_RE = re.compile(r"[\r\n]")


def _number(text: str) -> float | None:
    """The float NeMo RL printed, or None for anything else (a number longer than NeMo RL prints is not one)."""
    text = text.strip()
    if len(text) > _MAX_NUMBER_CHARS:
        return None
    try:
        return float(text)
    except ValueError:
        return None


def _unit_value(text: str) -> float | None:
    """A tqdm count such as ``64`` or ``1.2k`` as a number, or None for one longer than a count can be."""
    if len(text) > _MAX_NUMBER_CHARS:
        return None
    unit = text[-1] if text[-1] in _UNIT_SCALE else ""
    return float(text[: len(text) - len(unit)]) * _UNIT_SCALE[unit]


def _match_bar(body: str) -> tuple[str, float, float] | None:
    """A progress bar's (description, n, total), or None for any other line."""
    for pct in _PERCENT_RE.finditer(body):
        rest = _BAR_REST_RE.match(body, pct.end())
        if rest:
            n, total = _unit_value(rest.group("n")), _unit_value(rest.group("total"))
            if n is None or total is None:
                return None
            desc = body[: pct.start()].rstrip()
            desc = desc[:-1].rstrip() if desc.endswith(":") else desc
            return desc, n, total
    return None


def _wandb_run_url(text: str) -> str | None:
    """The run URL of a ``wandb: ... View run ... https://...`` line (without trailing punctuation), else None."""
    if not _WANDB_RE.match(text):
        return None
    view = _VIEW_RUN_RE.search(text, 6)
    url = _URL_RE.search(text, view.end()) if view else None
    if url is None or len(url.group()) > _MAX_URL_CHARS:
        return None
    return url.group().rstrip(".,;)'\"")


def _split_decorations(text: str) -> tuple[str, str, str]:
    """Split an ANSI-free line into (Ray actor prefix, body, Ray repeat marker); prefix and marker may be empty."""
    prefix = ""
    m = _RAY_PREFIX_RE.match(text)
    if m:
        prefix, text = m.group().rstrip(), text[m.end() :]
    repeat = ""
    marker = text.rfind("[repeated ")
    r = _RAY_REPEAT_RE.match(text, marker) if marker >= 0 else None
    if r and _only_dedup_advice(text[r.end() :].strip()):
        repeat, text = r.group(), text[:marker].rstrip()
    return prefix, text, repeat


def _only_dedup_advice(rest: str) -> bool:
    """Whether what follows a repeat marker is nothing, or only Ray's advice in parentheses."""
    if not rest:
        return True
    advice = rest.startswith(_RAY_DEDUP_ADVICE) and rest.endswith(")")
    # The advice is a whole word: "(Ray deduplicates logs by defaults" is something else.
    after = rest[len(_RAY_DEDUP_ADVICE) : len(_RAY_DEDUP_ADVICE) + 1]
    return advice and not (after.isalnum() or after == "_")


def strip_decorations(line: str) -> str:
    """A log line without its colour codes, Ray's actor prefix and Ray's repeat marker: what the process printed."""
    return _split_decorations(_strip_ansi(line))[1]


def _strip_ansi(text: str) -> str:
    """The text without terminal escape sequences."""
    return _ANSI_RE.sub("", text) if "\x1b" in text else text


def _compose(prefix: str, body: str, repeat: str) -> str:
    """Put a display line back together from its parts."""
    line = f"{prefix} {body}" if prefix else body
    return f"{line} {repeat}" if repeat else line


def new_log_text(full_text: str, offset: int) -> tuple[str, int]:
    """The part of a whole-log poll not seen yet, and the offset to pass next time.

    ``offset`` counts characters (not bytes) of the text already consumed. Ray job logs only grow, so a log shorter
    than ``offset`` was replaced: all of it is new.
    """
    if offset < 0:
        raise ValueError(f"offset must be >= 0, got {offset}")
    if offset > len(full_text):
        return full_text, len(full_text)
    return full_text[offset:], len(full_text)


# ---------------------------------------------------------------------------------------------------------------
# Metrics
# ---------------------------------------------------------------------------------------------------------------


@dataclass
class StepMetrics:
    """What NeMo RL printed about one GRPO step; a field is None until (unless) its line shows up.

    ``step``/``total_steps`` are the header's ``k/K``; NeMo RL restarts ``k`` at 1 each epoch (``epoch`` tells them
    apart). ``phase_times_s`` maps each timer of the ``Timing:`` block (``generation``, ``policy_training``, ...) to
    seconds; ``group_tokens_per_s_per_gpu`` maps each non-E2E ``(Tokens/sec/gpu)`` line to its value and
    ``group_tokens_per_s`` each ``(Tokens/sec)`` line of the per-group block (E2E included).
    """

    step: int
    total_steps: int
    epoch: int | None = None
    loss: float | None = None
    kl_error: float | None = None
    avg_reward: float | None = None
    avg_filtered_reward: float | None = None
    mean_gen_length: float | None = None
    total_step_time_s: float | None = None
    phase_times_s: dict[str, float] = field(default_factory=dict)
    e2e_samples_per_s_per_gpu: float | None = None
    e2e_tokens_per_s_per_gpu: float | None = None
    group_tokens_per_s_per_gpu: dict[str, float] = field(default_factory=dict)
    group_tokens_per_s: dict[str, float] = field(default_factory=dict)
    val_accuracy: float | None = None
    # The global step NeMo RL saved during this step ("Saving checkpoint for step N..." counts across epochs).
    checkpoint_step: int | None = None

    @property
    def label(self) -> str:
        """The step as NeMo RL shows it, ``k/K``."""
        return f"{self.step}/{self.total_steps}"

    @property
    def completed(self) -> bool:
        """Whether the step's training results were printed (the last step may still be running)."""
        return self.loss is not None or self.avg_reward is not None

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly form, floats to 12 significant digits (a NaN loss stays a float NaN, which Python's json
        writes as ``NaN``)."""
        return tidy(asdict(self))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StepMetrics:
        """Rebuild from :meth:`to_dict` output, ignoring keys this version does not know."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


class RunMetrics:
    """Per-step and run-level metrics read line by line from a NeMo RL GRPO driver log.

    Metric lines are recognised inside the section their header opened (``Training Results:``, ``Timing:``, ...),
    which stays open across unrelated lines: Ray prints actor output wherever it arrives, also between a header and
    its bullets. A step header closes every section.
    """

    def __init__(self) -> None:
        self.steps: list[StepMetrics] = []
        self.wandb_url: str | None = None
        self.checkpoints: list[int] = []
        # The job stopped itself at NeMo RL's checkpoint_must_save_by (the run's budget).
        self.timeout_reached = False
        # NeMo RL's setup ended (its deadline clock started), and how long it said it took.
        self.setup_complete = False
        self.setup_s: float | None = None
        self.initial_val_accuracy: float | None = None
        self._epoch: int | None = None
        self._section: str | None = None
        self._val_step: int | None = None

    @property
    def current(self) -> StepMetrics | None:
        """The step being printed now (the last header seen), if any."""
        return self.steps[-1] if self.steps else None

    @property
    def completed_steps(self) -> list[StepMetrics]:
        """The steps whose training results were printed."""
        return [s for s in self.steps if s.completed]

    def parse_line(self, line: str) -> None:
        """Read one complete log line; colour codes, a Ray actor prefix and a repeat marker are allowed."""
        _, body, _ = _split_decorations(_strip_ansi(line))
        self._parse_body(body)

    def _parse_body(self, body: str) -> None:
        """Read one line stripped of its decorations (a line too long to be NeMo RL's is skipped)."""
        if len(body) > MAX_PARSE_CHARS:
            return
        text = body.strip()
        if not text:
            return
        if text[0] == "=":
            self._parse_header(text)
            return
        for name, pattern in _SECTIONS:
            if pattern.match(text):
                self._section = name
                return
        if text[0] == "•":
            self._parse_bullet(text)
        elif text[0] == "-":
            self._parse_throughput(text)
        elif text.startswith("wandb:"):
            # The URL is printed when the run starts and again when it finishes; the first is the one to link.
            if self.wandb_url is None:
                self.wandb_url = _wandb_run_url(text)
        else:
            self._parse_event(text)

    def _parse_header(self, text: str) -> None:
        """Step and epoch headers."""
        m = _EPOCH_RE.match(text)
        if m:
            self._epoch = int(m.group(1))
            self._section = None
            return
        m = _STEP_RE.match(text)
        if not m:
            return
        self._section = None
        self._val_step = None
        step, total = int(m.group(1)), int(m.group(2))
        cur = self.current
        # Dynamic sampling re-prints the header of a step whose batch it had to regenerate: same step, not a new one.
        if cur is not None and not cur.completed and (cur.step, cur.epoch) == (step, self._epoch):
            cur.total_steps = total
            return
        self.steps.append(StepMetrics(step=step, total_steps=total, epoch=self._epoch))

    def _parse_event(self, text: str) -> None:
        """Validation starts and checkpoint saves."""
        m = _VAL_START_RE.search(text)
        if m:
            self._val_step = int(m.group(1))
            return
        if text.startswith(_TIMEOUT_REACHED):
            self.timeout_reached = True
            return
        if text == _SETUP_COMPLETE:
            self.setup_complete = True
            return
        m = _SETUP_TIME_RE.match(text)
        if m:
            self.setup_s = _number(m.group("s"))
            return
        m = _CHECKPOINT_RE.search(text)
        if m:
            self.checkpoints.append(int(m.group(1)))
            if self.current is not None:
                self.current.checkpoint_step = int(m.group(1))

    def _parse_bullet(self, text: str) -> None:
        """``• Key: value`` lines of the training, timing and validation sections."""
        m = _BULLET_RE.match(text)
        key = m.group("key").strip() if m else ""
        if not m or not key:
            return
        value = m.group("value").strip()
        cur = self.current
        if self._section == "val" and key == "Accuracy":
            acc = _number(value)
            # Validation before the first step (val_at_start) reports step 0; later ones run inside their step.
            if cur is None or self._val_step == 0:
                self.initial_val_accuracy = acc
            else:
                cur.val_accuracy = acc
        elif cur is None:
            return
        elif self._section == "train" and key in _TRAIN_KEYS:
            setattr(cur, _TRAIN_KEYS[key], _number(value))
        elif self._section == "timing":
            if key == "Total step time":
                s = _SECONDS_RE.match(value)
                cur.total_step_time_s = _number(s.group("s")) if s else None
            else:
                p = _PHASE_RE.match(value)
                seconds = _number(p.group("s")) if p else None
                if seconds is not None:
                    cur.phase_times_s[key] = seconds

    def _parse_throughput(self, text: str) -> None:
        """``- Group (Tokens/sec/gpu): x`` lines of the performance section."""
        cur = self.current
        if self._section != "perf" or cur is None:
            return
        m = _THROUGHPUT_RE.match(text)
        name = m.group("name").strip() if m else ""
        value = _number(m.group("value")) if m else None
        if not name or value is None:
            return
        per_gpu = bool(m.group("gpu"))
        if m.group("unit") == "Samples":
            if per_gpu and name == "E2E":
                cur.e2e_samples_per_s_per_gpu = value
        elif not per_gpu:
            cur.group_tokens_per_s[name] = value
        elif name == "E2E":
            cur.e2e_tokens_per_s_per_gpu = value
        else:
            cur.group_tokens_per_s_per_gpu[name] = value

    def summary(self) -> dict[str, Any]:
        """Run-level figures for when the job ends (JSON-friendly; None where the log had nothing)."""
        done = self.completed_steps
        rewarded = [s for s in done if s.avg_reward is not None]
        best = max(rewarded, key=lambda s: s.avg_reward or 0.0) if rewarded else None
        vals = [s.val_accuracy for s in self.steps if s.val_accuracy is not None]
        return tidy(
            {
                "steps_completed": len(done),
                "last_step": done[-1].label if done else None,
                "first_reward": rewarded[0].avg_reward if rewarded else None,
                "last_reward": rewarded[-1].avg_reward if rewarded else None,
                "best_reward": best.avg_reward if best else None,
                "best_reward_step": best.label if best else None,
                "mean_step_time_s": _mean([s.total_step_time_s for s in done]),
                "mean_e2e_tokens_per_s_per_gpu": _mean([s.e2e_tokens_per_s_per_gpu for s in done]),
                "mean_e2e_tokens_per_s": _mean([s.group_tokens_per_s.get("E2E") for s in done]),
                "initial_val_accuracy": self.initial_val_accuracy,
                "final_val_accuracy": vals[-1] if vals else self.initial_val_accuracy,
                "checkpoints": list(self.checkpoints),
                "wandb_url": self.wandb_url,
            }
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly form of everything parsed so far (for a trigger event or XCom)."""
        return {"steps": [s.to_dict() for s in self.steps], **self.run_state()}

    def run_state(self) -> dict[str, Any]:
        """:meth:`to_dict` without the steps: the run-level figures and the parse state."""
        return {
            "wandb_url": self.wandb_url,
            "checkpoints": list(self.checkpoints),
            "initial_val_accuracy": self.initial_val_accuracy,
            "setup_complete": self.setup_complete,
            "setup_s": self.setup_s,
            "timeout_reached": self.timeout_reached,
            # The epoch the next step header belongs to: all the parse state there is between two steps (a step
            # header closes every section).
            "epoch": self._epoch,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunMetrics:
        """Rebuild from :meth:`to_dict` output (the open section is not kept: taken between two steps, there is
        none)."""
        run = cls()
        run.steps = [StepMetrics.from_dict(s) for s in data.get("steps", [])]
        run.wandb_url = data.get("wandb_url")
        run.checkpoints = list(data.get("checkpoints", []))
        run.initial_val_accuracy = data.get("initial_val_accuracy")
        run.setup_complete = bool(data.get("setup_complete"))
        run.setup_s = data.get("setup_s")
        run.timeout_reached = bool(data.get("timeout_reached"))
        epoch = data.get("epoch")
        run._epoch = epoch if isinstance(epoch, int) and not isinstance(epoch, bool) else None
        return run


def summary_text(summary: dict[str, Any]) -> str:
    """A :meth:`RunMetrics.summary` as one readable paragraph for the task log (a missing figure is left out)."""
    s = {**RunMetrics().summary(), **summary}
    if not s["steps_completed"]:
        parts = ["no GRPO step completed"]
    else:
        parts = [f"{s['steps_completed']} GRPO step(s) completed (last {s['last_step']})"]
    if s["first_reward"] is not None and s["last_reward"] is not None and s["best_reward"] is not None:
        parts.append(
            f"avg reward {s['first_reward']:.4f} -> {s['last_reward']:.4f} "
            f"(best {s['best_reward']:.4f} at step {s['best_reward_step']})"
        )
    if s["mean_step_time_s"] is not None:
        parts.append(f"mean step time {s['mean_step_time_s']:.1f}s")
    if s["mean_e2e_tokens_per_s_per_gpu"] is not None:
        parts.append(f"E2E {s['mean_e2e_tokens_per_s_per_gpu']:.1f} tokens/s/GPU")
    if s["final_val_accuracy"] is not None:
        start = s["initial_val_accuracy"]
        shown = f"{start:.4f} -> " if start is not None else ""
        parts.append(f"validation accuracy {shown}{s['final_val_accuracy']:.4f}")
    if s["checkpoints"]:
        parts.append("checkpoints at step(s) " + ", ".join(str(c) for c in s["checkpoints"]))
    if s["wandb_url"]:
        parts.append(f"W&B {s['wandb_url']}")
    return "; ".join(parts)


def tidy(value: Any) -> Any:
    """``value`` with every finite float rounded to 12 significant digits (NeMo RL prints 4 decimals; sums and means
    of them carry binary noise like 0.15299999999999997 that XCom and the UI should not show)."""
    if isinstance(value, float):
        return float(f"{value:.12g}") if math.isfinite(value) else value
    if isinstance(value, dict):
        return {k: tidy(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [tidy(v) for v in value]
    return value


def _mean(values: Sequence[float | None]) -> float | None:
    """Mean of the values that are present."""
    present = [v for v in values if v is not None]
    return sum(present) / len(present) if present else None


# ---------------------------------------------------------------------------------------------------------------
# Following the log
# ---------------------------------------------------------------------------------------------------------------


@dataclass
class _Bar:
    """The last state seen of a progress bar still running."""

    display: str
    n: float


class LogFollower:
    """Incremental reader of a Ray job driver log: lines for the task log, metrics in :attr:`metrics`.

    ``feed`` takes chunks of any size; the result does not depend on where chunks split. Lines end at ``\\n``;
    ``\\r`` (a progress bar redrawing itself) also ends a segment. A progress bar (``...%|...| n/N``, or vLLM's
    ``...% Completed | n/N``) shows up once, when it reaches ``N``, as its last state; one abandoned before ``N``
    shows up as its last state when the next bar of the same name starts, or at :meth:`flush`. Bars are told apart
    by Ray actor prefix and description. Blank lines are dropped, colour codes removed, and lines longer than
    ``max_line_chars`` shortened.

    With a ``redactor``, every chunk passes through it before anything else: lines, bars, the tail and the metrics
    (the W&B URL too) are built from masked text only, so no split or cut can show part of a secret. The feeding
    methods never raise: a chunk that is not a ``str`` is ignored.
    """

    def __init__(
        self, *, tail_size: int = 200, max_line_chars: int = 2000, redactor: StreamRedactor | None = None
    ) -> None:
        if tail_size < 1 or max_line_chars < 1:
            raise ValueError("tail_size and max_line_chars must be >= 1")
        self.metrics = RunMetrics()
        self._redactor = redactor
        self.offset = 0
        self.lines_emitted = 0
        self._max_line_chars = max_line_chars
        self._tail: deque[str] = deque(maxlen=tail_size)
        self._partial = ""
        self._at_line_start = True
        self._line_prefix = ""
        self._bars: dict[tuple[str, str], _Bar] = {}
        # Bars that reached N: tqdm's close() repaints the final state, which must not count as a new bar. A dict used
        # as an insertion-ordered set, so the oldest can be dropped.
        self._finished: dict[tuple[str, str], None] = {}

    def feed(self, text: str) -> list[str]:
        """Consume the next chunk of the log; return the display lines it completed."""
        if not isinstance(text, str):
            return []
        if self._redactor is not None:
            text = self._redactor.feed(text)
        return self._feed_masked(text)

    def _feed_masked(self, text: str) -> list[str]:
        """Split already-redacted text into segments and take each complete one."""
        out: list[str] = []
        buf = self._partial + text
        pos = 0
        for m in _EOL_RE.finditer(buf):
            self._take(self._cut(buf[pos : m.start()], out), m.group() == "\n", out)
            pos = m.end()
        self._partial = self._cut(buf[pos:], out)
        return out

    def _cut(self, segment: str, out: list[str]) -> str:
        """Take the leading pieces of an overlong segment; cut at the same places however the text was chunked."""
        while len(segment) > _MAX_SEGMENT_CHARS:
            self._take(segment[:_MAX_SEGMENT_CHARS], False, out)
            segment = segment[_MAX_SEGMENT_CHARS:]
        return segment

    def feed_full_log(self, full_text: str) -> list[str]:
        """Consume a whole-log poll (Ray's ``GET /api/jobs/{id}/logs``): only the text after :attr:`offset` is new.

        A log shorter than what was already read is a replaced log: the stream state is reset and it is read whole.
        """
        if not isinstance(full_text, str):
            return []
        if len(full_text) < self.offset:
            self._partial, self._at_line_start, self._line_prefix = "", True, ""
            self._bars.clear()
            self._finished.clear()
            if self._redactor is not None:
                self._redactor.reset()
        new, self.offset = new_log_text(full_text, self.offset)
        return self.feed(new)

    def feed_at(self, text: str, start: int) -> list[str]:
        """Consume a chunk that begins at character ``start`` of the log, from a stream that resends the log from
        its start when it is reopened: only the part past :attr:`offset` is new, and each character is read once."""
        if not isinstance(text, str):
            return []
        new = text[max(0, self.offset - start) :]
        if not new:
            return []
        self.offset = max(self.offset, start) + len(new)
        return self.feed(new)

    def catch_up(self, full_text: str, offset: int) -> None:
        """Re-read the first ``offset`` characters of a whole log without returning their lines.

        For a fresh follower that resumes where an earlier one stopped (a re-deferred trigger knows only the
        offset): metrics, bar and tail state are rebuilt exactly, and the next :meth:`feed_full_log` returns only
        lines not shown before.
        """
        self.offset = 0
        self.feed_full_log(full_text[:offset])

    @property
    def at_line_start(self) -> bool:
        """Whether everything fed was a whole line and has been parsed: no unterminated line, nothing held back by
        the redactor. The metrics are then all the parse state there is (between two steps)."""
        held = self._redactor is not None and self._redactor.holding
        return not self._partial and self._at_line_start and not held

    def resume(self, metrics: RunMetrics, offset: int, lines_emitted: int, tail: Sequence[str]) -> None:
        """Go on from a store's snapshot, taken at a line start (:attr:`at_line_start`): its metrics, where in the log
        it was taken and what had been shown. The next read starts at ``offset``; a progress bar still running there is
        not known (it shows up once it finishes)."""
        self.metrics = metrics
        self.offset = offset
        self.lines_emitted = lines_emitted
        self._tail.clear()
        self._tail.extend(tail)
        self._partial, self._at_line_start, self._line_prefix = "", True, ""
        self._bars.clear()
        self._finished.clear()

    def flush(self) -> list[str]:
        """End of the log: the unterminated last line and the last state of every unfinished bar."""
        out: list[str] = []
        if self._redactor is not None:
            out += self._feed_masked(self._redactor.flush())
        if self._partial:
            self._take(self._partial, True, out)
            self._partial = ""
        for bar in self._bars.values():
            self._emit(bar.display, out)
        self._bars.clear()
        self._finished.clear()
        self._at_line_start, self._line_prefix = True, ""
        return out

    def tail(self, n: int = 20) -> list[str]:
        """The last ``n`` display lines (at most ``tail_size``), with running bars and the unterminated line."""
        if n <= 0:
            return []
        lines = list(self._tail) + [bar.display for bar in self._bars.values()]
        partial = _strip_ansi(self._partial).rstrip()
        if partial.strip():
            prefix = "" if self._at_line_start or _RAY_PREFIX_RE.match(partial) else self._line_prefix
            lines.append(_compose(prefix, partial, ""))
        return lines[-n:]

    def _take(self, raw: str, line_end: bool, out: list[str]) -> None:
        """Handle one segment: the text between two line or carriage-return terminators."""
        prefix, body, repeat = _split_decorations(_strip_ansi(raw))
        if self._at_line_start:
            self._line_prefix = prefix
        elif not prefix:
            # A bar redrawn after "\r" carries no prefix of its own: it belongs to the line's actor.
            prefix = self._line_prefix
        self._at_line_start = line_end
        if not body.strip():
            return
        # Bars and metric lines are short: a longer line is only shown (cut by _emit), never parsed.
        if len(body) <= MAX_PARSE_CHARS:
            bar = _match_bar(body.strip()) if "%" in body else None
            if bar:
                desc, n, total = bar
                self._update_bar(n, total, _compose(prefix, body.strip(), repeat), (prefix, desc), out)
                return
            self.metrics._parse_body(body)
        self._emit(_compose(prefix, body.rstrip(), repeat), out)

    def _update_bar(self, n: float, total: float, display: str, key: tuple[str, str], out: list[str]) -> None:
        """Record a bar state; emit it when the bar completes (or the previous one was abandoned)."""
        if n >= total:
            self._bars.pop(key, None)
            if key not in self._finished:
                self._finished[key] = None
                if len(self._finished) > _MAX_BARS:
                    del self._finished[next(iter(self._finished))]
                self._emit(display, out)
            return
        self._finished.pop(key, None)
        previous = self._bars.get(key)
        if previous is not None and n < previous.n:
            self._emit(previous.display, out)
        self._bars[key] = _Bar(display, n)
        if len(self._bars) > _MAX_BARS:
            # So many bars at once is no NeMo RL log: the oldest counts as abandoned, keeping memory and tail() bounded.
            self._emit(self._bars.pop(next(iter(self._bars))).display, out)

    def _emit(self, line: str, out: list[str]) -> None:
        """Add a display line to the result and the tail."""
        if len(line) > self._max_line_chars:
            line = f"{line[: self._max_line_chars]}… [{len(line) - self._max_line_chars} more chars]"
        out.append(line)
        self._tail.append(line)
        self.lines_emitted += 1


def last_finished_save(steps: Sequence[StepMetrics]) -> int | None:
    """The global step of the last checkpoint whose save finished (a later step started), else None."""
    finished = [s.checkpoint_step for s in steps[:-1] if s.checkpoint_step is not None]
    return finished[-1] if finished else None


def saved_after(steps: Sequence[StepMetrics], index: int) -> int | None:
    """The global step of the first checkpoint saved during ``steps[index:]`` whose save has finished, else None.

    NeMo RL saves at the end of a step and starts the next one only when the checkpoint is written (``tmp_step_N``
    renamed to ``step_N``), so a step header after the save line means the save is complete; stopping the job then
    loses nothing.
    """
    for position in range(max(index, 0), len(steps) - 1):
        if steps[position].checkpoint_step is not None:
            return steps[position].checkpoint_step
    return None


def save_in_progress(steps: Sequence[StepMetrics]) -> bool:
    """Whether the step being printed has begun a save ("Saving checkpoint for step N...") that has not finished
    (its results, printed after the save, have not come yet)."""
    return bool(steps) and steps[-1].checkpoint_step is not None and not steps[-1].completed


def newest_save(steps: Sequence[StepMetrics]) -> int | None:
    """The global step of the newest checkpoint whose save finished, else None.

    NeMo RL (and the local trainer) print a step's training results after its save, so a save is finished once its
    step completed or a later step started: a job that hangs after a step still has that step's save.
    """
    for position in range(len(steps) - 1, -1, -1):
        step = steps[position]
        if step.checkpoint_step is not None and (step.completed or position < len(steps) - 1):
            return step.checkpoint_step
    return None
