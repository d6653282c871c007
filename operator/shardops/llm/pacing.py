"""Pacing to a source's rate limit: each worker keeps to its share, limit / maxConcurrency.

No coordination is needed: at most maxConcurrency workers run a campaign's shards at once, so if
each keeps below limit / maxConcurrency per minute the campaign keeps below the limit. A worker
that is alone gets no more than its share (the price of needing no shared counter; raise
maxConcurrency's share by raising the limit you declare, not by coordination).

A worker spaces its requests at least 60 · maxConcurrency / requestsPerMinute seconds apart, and
after a call that used T tokens waits T · 60 · maxConcurrency / (tokensPerMinute - its largest T ·
maxConcurrency) (the bucket is charged after the fact: a completion's size is known only then, so
each worker keeps room for one more request); a shared Source that limits prompt and completion
tokens apart is paced the same way on each (the longest of the waits). In any 60 s window one worker
makes at most share + 1 requests, so the campaign at most limit + maxConcurrency; and, for requests
alike in size, uses at most its token share.

A source that refers to a shared Source (spec.sources[].sourceRef) is paced the same way, to the
campaign's share of the Source instead of a limit of its own: the operator hands the shares out
(logic/shares.py) and the worker runtime keeps the current one in the cooldown file, which the
command reads before each request. No share yet, or a share of 0, means no request until there is.

`shardops llm` runs once per shard attempt, so the pace outlives the process in a small file
under the worker pod's temporary directory, keyed by pod, campaign and source: a worker's next
shard continues the spacing (and a Retry-After) instead of starting with a burst. A pod of several
slots (spec.worker.slots) runs one such process per slot: each keeps its own spacing, and a
Retry-After any of them is told holds them all (`hold_pod_until`: its own small file next to the
pace, read before each request), since the upstream asked the pod, not one of its slots, to wait.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from shardops.api.llm import COOLDOWN_FILE_SHARE_KEY, COOLDOWN_FILE_SHARE_RATES

SECONDS_PER_MINUTE = 60.0
# After a wait the upstream asked for (Retry-After, here or at another worker of the campaign), each
# worker adds a random part of up to a quarter of the wait (at most 2 s), so the workers that waited
# together do not all call again in the same instant. Only ever added: never sooner than asked.
JITTER_SHARE = 0.25
JITTER_CAP_SECONDS = 2.0


def jittered(wait: float, draw: float) -> float:
    """`wait` plus its jitter; `draw` is uniform in [0, 1)."""
    return wait + draw * min(JITTER_CAP_SECONDS, JITTER_SHARE * max(wait, 0.0))


def _cooldown_file(path: Path | None) -> dict[str, object]:
    """What the worker runtime last wrote in the cooldown file ({} when nothing readable). Read before
    every request: a small local file, no API call."""
    if path is None:
        return {}
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def cooldown_until(path: Path | None) -> float | None:
    """The end (epoch seconds) of the source's cooldown the worker runtime wrote, or None."""
    until = _cooldown_file(path).get("until")
    return float(until) if isinstance(until, int | float) and _number(until) else None


def share_in(path: Path | None) -> tuple[float | None, ...] | None:
    """The campaign's share of a shared Source (requests, tokens, prompt tokens, completion tokens
    per minute; None: that one is not limited) the worker runtime wrote beside the cooldown, or None
    when it wrote none yet."""
    share = _cooldown_file(path).get(COOLDOWN_FILE_SHARE_KEY)
    if not isinstance(share, dict):
        return None
    rates = [share.get(name) for name in COOLDOWN_FILE_SHARE_RATES]
    if not all(r is None or _number(r) for r in rates):
        return None
    return tuple(None if r is None else float(r) for r in rates)


def part_of_remaining(
    remaining: float, share_per_minute: float | None, limit_per_minute: float | None
) -> float:
    """What a campaign may use of a provider budget's `remaining`, when the key is a shared Source's:
    its share's part of the provider's limit (x-ratelimit-limit-*). Every campaign on the Source reads
    the same remaining from its own answers, so each taking its part keeps them all within it
    together; without either figure, the whole (a campaign alone on its key)."""
    if share_per_minute is None or not limit_per_minute or limit_per_minute <= 0:
        return remaining
    return remaining * min(1.0, share_per_minute / limit_per_minute)


@dataclass(frozen=True)
class Share:
    """One worker's part of a source's limit, as the spacing it implies."""

    seconds_per_request: float = 0.0
    seconds_per_token: float = 0.0
    seconds_per_input_token: float = 0.0
    seconds_per_output_token: float = 0.0

    @classmethod
    def of(
        cls,
        requests_per_minute: float | None,
        tokens_per_minute: float | None,
        workers: int,
        input_tokens_per_minute: float | None = None,
        output_tokens_per_minute: float | None = None,
    ) -> Share:
        workers = max(workers, 1)

        def spacing(per_minute: float | None) -> float:
            return SECONDS_PER_MINUTE * workers / per_minute if per_minute else 0.0

        return cls(
            spacing(requests_per_minute),
            spacing(tokens_per_minute),
            spacing(input_tokens_per_minute),
            spacing(output_tokens_per_minute),
        )

    @property
    def limited(self) -> bool:
        return (
            self.seconds_per_request > 0
            or self.seconds_per_token > 0
            or self.seconds_per_input_token > 0
            or self.seconds_per_output_token > 0
        )


def _paid_from_budget_less_headroom(count: int, seconds_per_token: float, largest: int) -> float:
    """The wait after a request of `count` tokens, for a worker whose budget is one token each
    `seconds_per_token`, paying from that budget less `largest` tokens (capped at half of it)."""
    if seconds_per_token <= 0:
        return 0.0
    budget = SECONDS_PER_MINUTE / seconds_per_token  # tokens a minute, this worker's
    return count * SECONDS_PER_MINUTE / (budget - min(largest, budget / 2))


def state_path(pod: str, campaign: str, source: str) -> Path:
    digest = hashlib.sha256(f"{pod}\0{campaign}\0{source}".encode()).hexdigest()[:24]
    return Path(tempfile.gettempdir()) / f"shardops-llm-pace-{digest}.json"


@dataclass
class Pacer:
    """Waits before each request until the worker's share allows it; `next_at` is on the monotonic
    clock, which all processes of one machine share."""

    share: Share
    path: Path | None
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    next_at: float = field(default=0.0)
    # The largest request seen of each token kind (total, prompt, completion): the headroom `spent`
    # keeps for the next request, whose tokens are known only from its answer.
    largest: tuple[int, int, int] = (0, 0, 0)

    def __post_init__(self) -> None:
        if self.path is not None:
            with contextlib.suppress(OSError, ValueError, TypeError, KeyError):
                self.next_at = float(json.loads(self.path.read_text(encoding="utf-8"))["nextAt"])

    def wait(self) -> float:
        """Sleeps until the next request may go (its own spacing, and any hold of its pod); returns
        the time it goes."""
        now = self.clock()
        while True:
            # Looked at again after each sleep: another slot may have been told to wait meanwhile.
            until = max(self.next_at, self._pod_hold())
            if until <= now:
                return now
            self.sleep(until - now)
            now = max(self.clock(), until)

    def hold_pod_until(self, moment: float) -> None:
        """No request before `moment` from this worker nor from the other slots of its pod (a
        Retry-After: the upstream asked the pod to wait)."""
        self.hold_until(moment)
        hold = self._hold_path()
        if hold is None or moment <= self._pod_hold():
            return
        _replace(hold, {"holdUntil": moment})

    def _hold_path(self) -> Path | None:
        return self.path.with_suffix(".hold") if self.path is not None else None

    def _pod_hold(self) -> float:
        """The pod's hold (monotonic; 0 without one): a read of a few bytes, once per request."""
        hold = self._hold_path()
        if hold is None:
            return 0.0
        with contextlib.suppress(OSError, ValueError, TypeError, KeyError):
            return float(json.loads(hold.read_text(encoding="utf-8"))["holdUntil"])
        return 0.0

    def spent(self, started: float, tokens: int, prompt_tokens: int = 0, completion_tokens: int = 0) -> None:
        """A request went at `started` and used `tokens` (`prompt_tokens` of them in its prompt,
        `completion_tokens` in its answer): the next one waits for the share.

        A request's tokens are known only from its answer, so the last request of any 60 s window
        is one the window's budget did not pay for. The spacing therefore pays from the share less
        the largest request seen (at most half the share): in any window the requests before the last
        use at most that, and the last fits the headroom. Requests alike in size stay within the
        share, not one request over it per worker."""
        share = self.share
        used = (tokens, prompt_tokens, completion_tokens)
        self.largest = (
            max(self.largest[0], tokens),
            max(self.largest[1], prompt_tokens),
            max(self.largest[2], completion_tokens),
        )
        rates = (share.seconds_per_token, share.seconds_per_input_token, share.seconds_per_output_token)
        gap = max(
            share.seconds_per_request,
            *(
                _paid_from_budget_less_headroom(count, per_token, largest)
                for count, per_token, largest in zip(used, rates, self.largest, strict=True)
            ),
        )
        self.hold_until(started + gap)

    def hold_until(self, moment: float) -> None:
        """No request before `moment` (a Retry-After, a used-up provider budget)."""
        if moment > self.next_at:
            self.next_at = moment
            self._save()

    def tighten(self, remaining: float | None, reset_seconds: float | None, workers: int) -> None:
        """A provider said `remaining` requests (or tokens' worth) are left until its window resets:
        this worker's part of them spreads over the reset, never faster than its share."""
        if remaining is None or reset_seconds is None:
            return
        now = self.clock()
        if remaining < 1:
            self.hold_until(now + reset_seconds)
            return
        self.hold_until(now + reset_seconds * max(workers, 1) / remaining)

    def _save(self) -> None:
        if self.path is not None:
            _replace(self.path, {"nextAt": self.next_at})


def _replace(path: Path, body: dict[str, float]) -> None:
    """Write `body` to `path` whole or not at all (the other slots of the pod read it meanwhile);
    a pace that cannot be written only costs the next process its spacing."""
    temporary = path.with_suffix(f".{os.getpid()}.tmp")
    with contextlib.suppress(OSError):
        temporary.write_text(json.dumps(body), encoding="utf-8")
        temporary.replace(path)
