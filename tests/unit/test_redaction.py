"""Secret masking that cannot be split: the streaming redactor alone, the log follower built on it, and RayJobTrigger
against a scripted Ray Jobs API on 127.0.0.1 (real HTTP, real connection lookup from ``AIRFLOW_CONN_*``).

The leak check is strict: no substring of the token of 8 characters or more may appear anywhere the trigger writes
(logged lines, and the event: tail, message and metrics), so half a token fails a test as surely as a whole one.
"""

from __future__ import annotations

import asyncio
import json
import pickle
import random
import re
import time
from collections.abc import Callable
from typing import Any

import pytest

from nemo_rl_gke.observe.metrics import LogFollower
from nemo_rl_gke.observe.redaction import MAX_HOLD_CHARS, MIN_PARTIAL_AT_END, PIECE_CHARS, StreamRedactor
from nemo_rl_gke.triggers.rayjob import TAIL_LINE_MAX_BYTES, RayJobTrigger
from tests.triggers.scripted_api import scripted_api

TOKEN = "hf_PRINTEDsecret0123456789"
WANDB_KEY = "0a1b2c3d4e5f60718293a4b5c6d7e8f901234567"


def leaks(text: str, secret: str = TOKEN, min_len: int = 8) -> list[str]:
    """The substrings of ``secret`` at least ``min_len`` long that occur in ``text``."""
    return sorted(
        {secret[i : i + min_len] for i in range(len(secret) - min_len + 1) if secret[i : i + min_len] in text}
    )


def streamed(redactor: StreamRedactor, chunks: list[str]) -> str:
    redactor.reset()
    return "".join(redactor.feed(c) for c in chunks) + redactor.flush()


# --- the redactor -----------------------------------------------------------------------------------------------

SPLIT_TEXTS = {
    "whole": f"token is {TOKEN}\n",
    "newline": "token is hf_PRINTED\nsecret0123456789\n",
    "carriage return": "token is hf_PRINTED\rsecret0123456789\n",
    "crlf": "token is hf_PRINTED\r\nsecret0123456789\n",
    "every character": "token is " + "\n".join(TOKEN) + "\n",
    "actor prefix": "(Worker pid=7, ip=10.0.0.5) token is hf_PRI\n(Worker pid=7, ip=10.0.0.5) NTEDsecret0123456789\n",
    "colour codes": "token is \x1b[31mhf_PRINTED\x1b[0m\x1b[1msecret0123456789\x1b[0m\n",
    "percent-encoded": "see https://h/x?t=hf%5FPRINTED%73ecret0123456789&y=1\n",
    "percent-encoded lower hex": "see https://h/x?t=%68%66%5f%50RINTEDsecret0123456789\n",
    "json-escaped": '{"url": "https:\\/\\/h\\/hf_PRINTEDsecret0123456789"}\n',
}


@pytest.mark.parametrize("name", SPLIT_TEXTS)
def test_a_split_or_encoded_secret_is_masked_whole(name: str) -> None:
    out = StreamRedactor([TOKEN]).redact(SPLIT_TEXTS[name])
    assert leaks(out, min_len=4) == [], out
    assert "***" in out


def test_breaks_and_prefixes_inside_a_secret_are_kept() -> None:
    redactor = StreamRedactor([TOKEN])
    assert redactor.redact("a hf_PRINTED\nsecret0123456789 b\n") == "a ***\n*** b\n"
    assert redactor.redact("hf_PRINTED\rsecret0123456789") == "***\r***"
    assert redactor.redact("x hf_PRI\n(W pid=7) NTEDsecret0123456789") == "x ***\n(W pid=7) ***"


@pytest.mark.parametrize("name", SPLIT_TEXTS)
def test_every_chunk_boundary_two_and_three_chunks(name: str) -> None:
    text = SPLIT_TEXTS[name]
    redactor = StreamRedactor([TOKEN])
    whole = redactor.redact(text)
    for i in range(len(text) + 1):
        assert streamed(redactor, [text[:i], text[i:]]) == whole, i
    rng = random.Random(7)
    for _ in range(200):
        i, j = sorted(rng.sample(range(len(text) + 1), 2))
        assert streamed(redactor, [text[:i], text[i:j], text[j:]]) == whole, (i, j)


def test_text_without_a_secret_passes_unchanged_and_is_held_only_while_it_could_start_one() -> None:
    redactor = StreamRedactor([TOKEN])
    assert redactor.feed("step 1 done\n") == "step 1 done\n"
    assert redactor.feed("loading hf_PRI") == "loading "  # could be the token: wait for more
    assert redactor.feed("ZE winner\n") == "hf_PRIZE winner\n"  # it was not
    assert redactor.feed("end with h\n") == "end with "
    assert redactor.flush() == "h\n"


def test_flush_masks_a_long_unfinished_start_and_releases_a_short_one() -> None:
    redactor = StreamRedactor([TOKEN])
    assert redactor.feed("killed while printing hf_PRINTEDsec") == "killed while printing "
    assert redactor.flush() == "***"
    short = TOKEN[: MIN_PARTIAL_AT_END - 1]
    assert redactor.feed(f"x {short}") == "x "
    assert redactor.flush() == short


def test_reset_drops_the_held_text() -> None:
    redactor = StreamRedactor([TOKEN])
    assert redactor.feed("a hf_PRINTED") == "a "
    redactor.reset()
    assert redactor.flush() == ""


def test_a_secret_split_by_many_breaks_across_polls_is_masked() -> None:
    redactor = StreamRedactor([TOKEN])
    gap = "\n" * 1000 + "\n(W pid=1) " * 100
    assert streamed(redactor, ["hf_PRINTED" + gap, "secret0123456789 x\n"]) == "***" + gap + "*** x\n"


def test_held_text_is_bounded() -> None:
    redactor = StreamRedactor([TOKEN])
    released = redactor.feed("hf_PRINTED" + "\n" * (MAX_HOLD_CHARS + 10))
    # Too long to wait for: the start is masked as if it were the token and nothing is held.
    assert released == "***" + "\n" * (MAX_HOLD_CHARS + 10)
    assert redactor.flush() == ""


def test_overlapping_and_periodic_secrets() -> None:
    redactor = StreamRedactor(["abcdefgh", "efghijkl", "xyxyxy"])
    assert redactor.redact("0abcdefghijkl1") == "0***1"
    assert redactor.redact("xyxyxyxyxy!") == "***!"


def test_long_secret_is_masked_in_pieces_wherever_they_appear() -> None:
    secret = "".join(random.Random(3).choice("ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789") for _ in range(PIECE_CHARS * 3))
    redactor = StreamRedactor([secret])
    assert leaks(redactor.redact(f"k={secret}\n"), secret) == []
    split = secret[:100] + "\n" + secret[100:]
    assert leaks(redactor.redact(split), secret) == []
    assert leaks(redactor.redact(secret[PIECE_CHARS : 2 * PIECE_CHARS]), secret) == []  # one piece alone


def test_short_and_empty_secrets_are_ignored() -> None:
    redactor = StreamRedactor(["", "abcd", None])  # type: ignore[list-item]
    assert not redactor.active
    assert redactor.feed("abcd") == "abcd"
    assert redactor.flush() == ""


def test_secret_with_special_characters_plain_and_encoded() -> None:
    secret = 'p@ss w%rd/"x\\y€'
    redactor = StreamRedactor([secret])
    encodings = [
        secret,
        "p%40ss%20w%25rd%2F%22x%5Cy%E2%82%AC",
        "p%40ss+w%25rd/%22x%5cy%e2%82%ac",
        'p@ss w%rd\\/\\"x\\\\y€',
    ]
    for text in encodings:
        out = redactor.redact(f"<{text}>")
        assert out == "<***>", (text, out)


@pytest.mark.parametrize(
    "secret",
    [
        "".join(chr(i) for i in range(32, 127)),  # every printable ASCII character, regex metacharacters included
        "".join(chr(i) for i in range(32)) + "abcdef",  # control characters; the line breaks become gaps
        "ab\ud800cdef",  # a lone surrogate
        "é€🚀 x\u2028y",
    ],
)
def test_any_secret_value_builds_a_redactor_that_masks_it(secret: str) -> None:
    out = StreamRedactor([secret]).redact(f"<{secret}>")
    assert re.fullmatch(r"<(?:\*\*\*|[\r\n])+>", out), out


def test_redact_value_masks_keys_and_values_and_keeps_other_types() -> None:
    redactor = StreamRedactor([TOKEN])
    value = {"url": f"https://x/{TOKEN}", TOKEN: [1, 2.5, None, ("a", TOKEN)], "n": 3}
    assert redactor.redact_value(value) == {"url": "https://x/***", "***": [1, 2.5, None, ("a", "***")], "n": 3}


def test_the_values_are_never_shown_or_serialized() -> None:
    redactor = StreamRedactor([TOKEN])
    assert TOKEN not in repr(redactor) and TOKEN not in str(redactor)
    with pytest.raises(TypeError, match="never serialized"):
        pickle.dumps(redactor)
    assert pickle.loads(pickle.dumps(StreamRedactor(()))).feed("x") == "x"  # nothing secret: an ordinary object


@pytest.mark.parametrize("seed", range(4))
def test_fuzz_secrets_in_random_text_and_random_chunks(seed: int) -> None:
    rng = random.Random(seed)
    secrets = [TOKEN, WANDB_KEY]
    redactor = StreamRedactor(secrets)
    alphabet = "abcdefhPRsecr0123456789_ \n\r\x1b[m()%=•|:"
    gaps = ["\n", "\r", "\r\n", "\n(W pid=1) ", "\x1b[0m", "\n\x1b[36m(W pid=2)\x1b[0m "]
    for _ in range(30):
        parts = []
        for _ in range(rng.randint(1, 6)):
            parts.append("".join(rng.choice(alphabet) for _ in range(rng.randint(0, 60))))
            secret = rng.choice(secrets)
            cuts = sorted(rng.sample(range(1, len(secret)), rng.randint(0, 3)))
            pieces = [secret[a:b] for a, b in zip([0, *cuts], [*cuts, len(secret)], strict=True)]
            parts.append("".join(p + rng.choice(gaps) for p in pieces[:-1]) + pieces[-1])
        text = "".join(parts)
        cuts = sorted(rng.sample(range(len(text) + 1), rng.randint(0, 8)))
        chunks = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
        out = streamed(redactor, chunks)
        assert out == redactor.redact(text)
        for secret in secrets:
            assert leaks(out, secret) == [], (text, out)


@pytest.mark.parametrize("seed", range(4))
def test_fuzz_text_without_secrets_comes_out_unchanged(seed: int) -> None:
    rng = random.Random(seed)
    redactor = StreamRedactor([TOKEN, WANDB_KEY])
    alphabet = "abcdefhPRsecrt0123456789_ \n\r\x1b[m()%5F•"
    text = "".join(rng.choice(alphabet) for _ in range(20000))
    assert not leaks(text) and not leaks(text, WANDB_KEY)
    cuts = sorted(rng.sample(range(len(text)), 50))
    chunks = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    assert streamed(redactor, chunks) == text


# --- linear time ----------------------------------------------------------------------------------------------------


def _costs(fn: Callable[[str], object], small: str, large: str, calls: int) -> tuple[float, float]:
    """CPU seconds for ``calls`` calls on each text, the minimum of seven interleaved tries (noise only adds time,
    and interleaving spreads a noisy spell over both sizes)."""
    best = [float("inf"), float("inf")]
    for _ in range(7):
        for i, text in enumerate((small, large)):
            start = time.process_time()
            for _ in range(calls):
                fn(text)
            best[i] = min(best[i], time.process_time() - start)
    return best[0], best[1]


def assert_linear(fn: Callable[[str], object], shape: Callable[[int], str], sizes: tuple[int, ...]) -> list[float]:
    """Time ``fn`` on shape(n) and shape(4n) for each n: linear gives a ratio near 4, quadratic 16, cubic 64.

    Small sizes come first, so a super-linear version fails in seconds instead of running for minutes. A ratio
    just over the bound is measured again (at most twice): a super-linear pattern never gets under it.
    """
    ratios = []
    for n in sizes:
        small, large = shape(n), shape(4 * n)
        calls = 1
        while calls < 1 << 16:
            start = time.process_time()
            for _ in range(calls):
                fn(small)
            if time.process_time() - start >= 0.002:
                break
            calls *= 2
        ratio = float("inf")
        for _ in range(3):
            t_small, t_large = _costs(fn, small, large, calls)
            ratio = min(ratio, t_large / max(t_small, 1e-9))
            if ratio <= 6 or ratio > 10:
                break
        ratios.append(round(ratio, 2))
        assert ratio <= 6, f"time(4n)/time(n) = {ratio:.1f} at n={n}"
    return ratios


def _repeat(unit: str, n: int) -> str:
    return (unit * (n // len(unit) + 1))[:n]


REDACTOR_SHAPES: dict[str, Callable[[int], str]] = {
    "first character": lambda n: "h" * n,
    "token prefixes": lambda n: _repeat("hf_PRINTED\n", n),
    "tokens": lambda n: _repeat(TOKEN, n),
    # Starts of the token each followed by a long run of what may sit inside it: held back, or (runs longer than
    # MAX_HOLD_CHARS) masked and released; periodic, so n and 4n cross those thresholds alike.
    "prefix then breaks": lambda n: _repeat("hf_PRINTED" + "\n" * 20000, n),
    "prefix then actor prefixes": lambda n: _repeat("hf_PRI" + "\n(W pid=1) " * 2000, n),
    "percent signs": lambda n: _repeat("%6", n),
    "escapes": lambda n: _repeat("\x1b[", n),
    "parentheses": lambda n: "hf_\n" + _repeat("(", n),
}


@pytest.mark.parametrize("name", REDACTOR_SHAPES)
def test_redaction_is_linear(name: str) -> None:
    redactor = StreamRedactor([TOKEN, WANDB_KEY])

    def stream(text: str) -> str:
        return redactor.feed(text) + redactor.flush()

    # 160,000 and more: several SLICE_CHARS slices at both sizes, so both are in the same steady state.
    print(name, assert_linear(stream, REDACTOR_SHAPES[name], (4000, 160000)))


# --- the follower redacts before it splits, cuts or parses ---------------------------------------------------------


def test_the_follower_never_sees_a_secret_cut_at_the_display_limit() -> None:
    follower = LogFollower(max_line_chars=40, redactor=StreamRedactor([TOKEN]))
    line = "x" * 30 + TOKEN + " tail\n"  # the 40-character cut falls inside the token
    lines = follower.feed(line) + follower.flush()
    assert lines == ["x" * 30 + "*** tail"]


def test_the_follower_parses_the_wandb_url_from_masked_text() -> None:
    follower = LogFollower(redactor=StreamRedactor([TOKEN]))
    follower.feed(f"wandb: 🚀 View run at https://wandb.ai/e/p/runs/abc?k={TOKEN}\n")
    assert follower.metrics.wandb_url == "https://wandb.ai/e/p/runs/abc?k=***"


# --- RayJobTrigger against a scripted Ray Jobs API ------------------------------------------------------------------

JOB = "nemo-rl-redact-1"
JOB_PATH = f"/api/jobs/{JOB}"
LOGS_PATH = f"/api/jobs/{JOB}/logs"
RUNNING = {"submission_id": JOB, "status": "RUNNING"}
SUCCEEDED = {"submission_id": JOB, "status": "SUCCEEDED", "message": "Job finished successfully."}


class Recorder:
    """Stands in for the trigger's logger and keeps every line it logs."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def info(self, message: str, *args: Any, **kwargs: Any) -> None:
        self.lines.append(message % args if args else message)

    warning = debug = exception = error = info


def run_trigger(polls: list[str], end: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> tuple[dict, list[str]]:
    """Follow a job whose whole log is ``polls[i]`` at poll i and whose status is ``end`` at the last poll."""
    monkeypatch.setenv("AIRFLOW_CONN_HF_REDACT", json.dumps({"conn_type": "generic", "password": TOKEN}))
    scripts = {
        JOB_PATH: [(200, RUNNING)] * (len(polls) - 1) + [(200, end)],
        LOGS_PATH: [(200, {"logs": text}) for text in polls],
    }

    async def follow() -> tuple[dict, list[str]]:
        async with scripted_api(scripts) as api:
            trigger = RayJobTrigger(
                address=api.url, submission_id=JOB, poll_interval=0.01, secret_conn_ids=["hf_redact"]
            )
            recorder = Recorder()
            trigger._log = recorder  # type: ignore[assignment]
            events = [e.payload async for e in trigger.run()]
            assert api.count(LOGS_PATH) == len(polls)
            return events[0], recorder.lines

    return asyncio.run(asyncio.wait_for(follow(), 30))


def assert_masked(event: dict, lines: list[str]) -> None:
    assert leaks("\n".join(lines)) == [], lines
    assert leaks(json.dumps(event, ensure_ascii=False)) == [], event


FILLER = "x" * 1990  # the trigger's follower cuts display lines at 2000 characters: inside the token
TRIGGER_CASES: dict[str, tuple[list[str], str]] = {
    "split by a newline": (["token is hf_PRINTED\nsecret0123456789 end\n"], "token is ***"),
    "split by a carriage return": (["token is hf_PRINTED\rsecret0123456789 end\n"], "token is ***"),
    "split across two polls": (["token is hf_PRINTED\n", "token is hf_PRINTED\nsecret0123456789 end\n"], "*** end"),
    "split across two polls mid-line": (["token is hf_PRINT", f"token is {TOKEN} end\n"], "token is *** end"),
    "cut at the display limit": ([f"{FILLER}{TOKEN}\n"], f"{FILLER}***"),
    "percent-encoded in a line": ([f"GET /login?token=hf%5F{TOKEN[3:]} end\n"], "GET /login?token=*** end"),
}


@pytest.mark.parametrize("name", TRIGGER_CASES)
def test_trigger_masks_split_tokens_in_logged_lines_and_the_event(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    polls, shown = TRIGGER_CASES[name]
    event, lines = run_trigger(polls, SUCCEEDED, monkeypatch)
    assert event["status"] == "success", event
    assert_masked(event, lines)
    # The event's tail lines are clipped shorter still (the event is logged as one line).
    assert any(shown[:TAIL_LINE_MAX_BYTES] in line for line in event["tail"]), event["tail"]
    assert any(shown in line for line in lines), lines


def test_trigger_masks_a_token_inside_the_wandb_url_of_the_metrics(monkeypatch: pytest.MonkeyPatch) -> None:
    log = f"wandb: 🚀 View run at https://wandb.ai/team/nemo-rl/runs/k3x9?api_key={TOKEN}\nstep\n"
    event, lines = run_trigger([log], SUCCEEDED, monkeypatch)
    assert_masked(event, lines)
    assert event["summary"]["wandb_url"] == "https://wandb.ai/team/nemo-rl/runs/k3x9?api_key=***"


def test_trigger_masks_a_split_token_in_ray_s_message(monkeypatch: pytest.MonkeyPatch) -> None:
    failed = {
        "submission_id": JOB,
        "status": "FAILED",
        "message": "Job entrypoint command failed. Last available logs:\nhf_PRINTED\r\nsecret0123456789\n",
    }
    event, lines = run_trigger(["booting\n"], failed, monkeypatch)
    assert event["status"] == "failed"
    assert_masked(event, lines)
    assert "logs:\n***\r\n***" in event["message"]


def test_a_logs_error_answer_does_not_restart_the_log(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_HF_REDACT", json.dumps({"conn_type": "generic", "password": TOKEN}))
    scripts = {
        JOB_PATH: [(200, RUNNING), (200, RUNNING), (200, SUCCEEDED)],
        LOGS_PATH: [(200, {"logs": "one\n"}), (503, {"error": "busy"}), (200, {"logs": "one\ntwo\n"})],
    }

    async def follow() -> list[str]:
        async with scripted_api(scripts) as api:
            # Whole-log downloads (a proxy without websockets): an error answer between two must not restart it.
            trigger = RayJobTrigger(address=api.url, submission_id=JOB, poll_interval=0.01, log_stream=False)
            recorder = Recorder()
            trigger._log = recorder  # type: ignore[assignment]
            [e async for e in trigger.run()]
            return recorder.lines

    assert asyncio.run(asyncio.wait_for(follow(), 30)) == [f"Following Ray job {JOB}", "[ray job] one", "[ray job] two"]


def test_the_trigger_yields_one_event_even_when_building_it_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    scripts = {JOB_PATH: [(200, SUCCEEDED)], LOGS_PATH: [(200, {"logs": "one\n"})]}

    def broken() -> dict:
        raise RuntimeError(f"metrics with {TOKEN}")

    async def follow() -> list[dict]:
        async with scripted_api(scripts) as api:
            trigger = RayJobTrigger(address=api.url, submission_id=JOB, poll_interval=0.01)
            trigger._log = Recorder()  # type: ignore[assignment]
            await trigger._load_secrets()
            monkeypatch.setattr(trigger, "_load_secrets", _noop)
            monkeypatch.setattr(trigger.follower.metrics, "summary", broken)
            return [e.payload async for e in trigger.run()]

    [event] = asyncio.run(asyncio.wait_for(follow(), 30))
    assert event["status"] == "error" and event["message"] == f"following Ray job {JOB} failed: RuntimeError"


async def _noop() -> None:
    return None
