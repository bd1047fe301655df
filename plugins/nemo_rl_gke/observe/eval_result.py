"""The result block NeMo RL's evaluation prints, read from a Ray job's log.

``nemo_rl/evals/eval.py`` ``_print_results`` (v0.5.0 lines 500-505, v0.7.0 lines 537-542, the same at both) prints,
once, from the driver::

    print("\\n" + "=" * 60)
    print(f"{model_name=} {dataset_name=}")
    print(f"{max_new_tokens=} {temperature=} {top_p=} {top_k=} {seed=}\\n")
    print(f"metric={metric[:-1]}{k_value} {num_tests_per_prompt=}\\n")
    print(f"score={average_score:.4f} ({score}/{dataset_size})")
    print("=" * 60 + "\\n")

``model_name`` and ``dataset_name`` are the basenames, printed with ``repr``; ``max_new_tokens`` is
``vllm_cfg.max_model_len``; ``score`` is the sum of the per-problem pass@k (or cons@k) and ``dataset_size`` the
number of problems. Ray prints the driver's lines as they are and other processes' with a ``(pid=...)`` prefix and
``[repeated Nx across cluster]`` markers: both are stripped before matching, and the last complete block wins.

Pure and stdlib-only; a hostile log can neither stall it (every pattern is linear) nor make it raise.
"""

from __future__ import annotations

import ast
import math
import re
from dataclasses import asdict, dataclass
from typing import Any

from nemo_rl_gke.observe.metrics import MAX_PARSE_CHARS, strip_decorations

_NUM = r"[-+]?\d{1,12}(?:\.\d{1,20})?(?:[eE][-+]?\d{1,4})?"
# repr() of a basename: quoted, no newline; a quote inside uses the other quote (or an escape).
_REPR = r"'[^'\n]{0,512}'|\"[^\"\n]{0,512}\""
_NAMES_RE = re.compile(rf"^model_name=(?P<model>{_REPR}) dataset_name=(?P<dataset>{_REPR})$")
_SETTINGS_RE = re.compile(
    rf"^max_new_tokens=(?P<max_new_tokens>\d{{1,9}}) temperature=(?P<temperature>{_NUM}) top_p=(?P<top_p>{_NUM}) "
    rf"top_k=(?P<top_k>-?\d{{1,9}}) seed=(?P<seed>-?\d{{1,19}})$"
)
_METRIC_RE = re.compile(r"^metric=(?P<metric>pass|cons)@(?P<k>\d{1,4}) num_tests_per_prompt=(?P<n>\d{1,6})$")
_SCORE_RE = re.compile(rf"^score=(?P<score>{_NUM}) \((?P<total>{_NUM})/(?P<size>\d{{1,12}})\)$")


@dataclass(frozen=True)
class EvalResult:
    """One evaluation as NeMo RL printed it."""

    model: str
    dataset: str
    max_new_tokens: int
    temperature: float
    top_p: float
    top_k: int
    seed: int
    metric: str
    k: int
    num_tests_per_prompt: int
    score: float
    total: float
    problems: int

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form (XCom, the Asset event)."""
        return asdict(self)

    @property
    def settings(self) -> dict[str, Any]:
        """What makes two scores comparable: benchmark, metric and sampling."""
        return {
            "dataset": self.dataset,
            "metric": f"{self.metric}@{self.k}",
            "num_tests_per_prompt": self.num_tests_per_prompt,
            "max_new_tokens": self.max_new_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "seed": self.seed,
        }

    def text(self) -> str:
        """One line: "score 0.6133 (157.0/256) on gsm8k, pass@1 over 1 sample(s)"."""
        return (
            f"score {self.score:.4f} ({self.total:g}/{self.problems}) on {self.dataset}, {self.metric}@{self.k} over "
            f"{self.num_tests_per_prompt} sample(s)"
        )


def parse_eval_result(log: str) -> EvalResult | None:
    """The last complete result block in ``log`` (None: none)."""
    found = None
    names = settings = metric = None
    for raw in log.splitlines():
        if len(raw) > MAX_PARSE_CHARS:
            continue
        line = strip_decorations(raw).strip()
        if m := _NAMES_RE.match(line):
            names, settings, metric = m, None, None
        elif (m := _SETTINGS_RE.match(line)) and names is not None:
            settings = m
        elif (m := _METRIC_RE.match(line)) and settings is not None:
            metric = m
        elif (m := _SCORE_RE.match(line)) and metric is not None:
            result = _result(names, settings, metric, m)
            if result is not None:
                found = result
            names = settings = metric = None
    return found


def _result(names: Any, settings: Any, metric: Any, score: Any) -> EvalResult | None:
    values = [float(score["score"]), float(score["total"]), float(settings["temperature"]), float(settings["top_p"])]
    if not all(math.isfinite(v) for v in values):
        return None
    try:
        model, dataset = ast.literal_eval(names["model"]), ast.literal_eval(names["dataset"])
    except (ValueError, SyntaxError):
        return None
    return EvalResult(
        model=str(model),
        dataset=str(dataset),
        max_new_tokens=int(settings["max_new_tokens"]),
        temperature=values[2],
        top_p=values[3],
        top_k=int(settings["top_k"]),
        seed=int(settings["seed"]),
        metric=metric["metric"],
        k=int(metric["k"]),
        num_tests_per_prompt=int(metric["n"]),
        score=values[0],
        total=values[1],
        problems=int(score["size"]),
    )
