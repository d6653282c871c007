"""Running a claimed shard (`ShardRun`, on its `Holding`): read a stored result first, else run the
user's command with the shard's remaining items, poll its results file and exit, heartbeat when due,
and end the attempt as the command's exit and output decide. A finalize shard's command also gets
every finished item of the campaign; a shard of the built-in LLM worker, its source's cooldown.

A heartbeat (and every later write) first proves the claim is still ours (heartbeat.py); if it is
not, the command is killed and nothing is written.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from shardops.api.campaign import Campaign, SourceCooldown, SourceShare
from shardops.api.enums import ErrorClass, ShardClass
from shardops.api.items import ItemsOverLimit
from shardops.api.llm import COOLDOWN_FILE_ENV, COOLDOWN_FILE_SHARE_KEY, COOLDOWN_FILE_SHARE_RATES
from shardops.k8s.api import CAMPAIGNS, Forbidden
from shardops.k8s.campaigns import ItemsUnavailable
from shardops.logic.failures import classify_failure
from shardops.logic.shares import Rates
from shardops.state import cooldowns, results
from shardops.store.items import campaign_items
from shardops.store.lines import ItemsChanged, NotJsonlText
from shardops.store.records import ResultTooLarge, StoreCorrupt, StoreUnavailable
from shardops.store.s3 import S3Store
from shardops.worker.heartbeat import Fenced, FenceReason
from shardops.worker.holding import TRANSIENT_ERRORS, Holding, Outcome
from shardops.worker.logs import emit, log
from shardops.worker.metrics import CommandMode, CommandOutcome, HeartbeatOutcome
from shardops.worker.persistent import ServedCommand
from shardops.worker.runner import (
    COOLDOWN_FILE,
    SHARD_VARIABLES,
    AttemptFiles,
    Command,
    CommandFailure,
    ResultsReader,
    ShardCommand,
    WorkItem,
    campaign_variables,
    command_env,
    read_error_file,
)

# A heartbeat that failed for a transient reason is retried this soon, well inside the lease.
_HEARTBEAT_RETRY_SECONDS = 1.0


@dataclass
class ShardRun(Holding):
    """One claimed shard's attempt: its command run to an outcome (the claim and its writes:
    `Holding`)."""

    # Per-source cooldowns known at the claim; a heartbeat of an LLM shard refreshes its source's.
    cooldowns: Mapping[str, SourceCooldown] = field(default_factory=dict)
    # How the command ended, once known (shardops_worker_command_duration_seconds); None: not yet.
    command_outcome: CommandOutcome | None = None
    # The file the built-in LLM worker reads its source's cooldown from (None: not such a shard).
    cooldown_file: Path | None = None
    # The campaign's shares of shared Sources as its status last said (None: as at the claim); a
    # heartbeat of an LLM shard refreshes them with the cooldowns, so a lowered share is obeyed within
    # a heartbeat interval (logic/shares.py counts on it).
    shares: Mapping[str, SourceShare] | None = None

    # --- the run ----------------------------------------------------------------------------------

    def execute(self) -> Outcome:
        try:
            try:
                return self._execute()
            except (Fenced, Forbidden):
                raise
            except Exception as error:
                # Trouble of our own or of the API mid-shard: record it as a failed attempt (retryable,
                # bounded by maxAttempts) if the API lets us, so the shard does not wait out its lease.
                log.exception("%s: attempt %d broke off", self.name, self.attempt)
                return self._abandon(error)
        except Fenced as fenced:
            self.slot.metrics.observe_fenced(fenced.reason)
            emit(
                "fenced",
                shard=self.name,
                attempt=self.attempt,
                token=self.lease.fencing_token,
                discarded=len(self.tally.fresh),
                reason=str(fenced),
            )
            return Outcome.FENCED

    def _abandon(self, error: Exception) -> Outcome:
        try:
            if isinstance(error, StoreUnavailable):
                return self.fail(ErrorClass.UNAVAILABLE, f"result store: {error}", self.claimed.source)
            return self.fail(
                ErrorClass.UNKNOWN, f"the worker broke off the attempt: {error!r}", self.claimed.source
            )
        except (Fenced, Forbidden):
            raise
        except Exception as again:
            # Nothing could be written: the Lease runs out and the shard is reclaimed as a zombie.
            emit(
                "abandoned",
                shard=self.name,
                error=repr(error),
                then=repr(again),
                lease_until=self.lease.until,
            )
            return Outcome.ABANDONED

    def _execute(self) -> Outcome:
        if self.shard.current_status.rerun_errored:
            # A retry of the errored items: the shard's result (the one they errored in) is not
            # reused, only read for the others' results.
            self.tally.rerun_errored(self._erred_result())
        else:
            try:
                existing = self.with_store(
                    "reading the stored result", lambda: self.store.read_result(self.key)
                )
            except StoreCorrupt as corrupt:
                log.warning("%s: stored result does not verify (%s); recomputing", self.name, corrupt)
                existing = None
            if existing is not None:
                return self.complete(existing, reused=True)
        if self.slot.stop.is_set():
            return self.release()
        work = self.tally.remaining()
        # A finalize shard has no items: its command runs once, with an empty items file.
        if not work and not self.finalize:
            return self.complete(None, reused=False)
        return self.run_command(work)

    def _erred_result(self) -> str | None:
        """The text of the result a shard rerunning its errored items had (status.result), None when
        it has none or it does not verify (then every item without a stored result runs again)."""
        result = self.shard.current_status.result
        if result is None:
            return None
        try:
            return self.with_store(
                "reading the result", lambda: self.store.read_ref(result.ref, self.key)
            ).text
        except StoreCorrupt as corrupt:
            log.warning("%s: its result does not verify (%s); running its items again", self.name, corrupt)
            return None

    @property
    def finalize(self) -> bool:
        return self.shard.spec.shard_class is ShardClass.FINALIZE

    @property
    def persistent(self) -> bool:
        """Run by the worker's persistent command: spec.worker's choice, for work shards only."""
        return not self.finalize and self.campaign.spec.worker.runs_persistent()

    def write_campaign_results(self, path: Path) -> tuple[ErrorClass, str] | None:
        """The finalize shard's input: every finished item of the campaign, one JSON line each in
        item order (what `kubectl campaign results` prints), written before its command starts.
        Returns why it could not be written, or None. A whole-campaign read, once per campaign (the
        finalize shard runs after every work shard); the claim is renewed at every heartbeat
        interval meanwhile, since reading many stored results can outlast a lease — between two
        ledger segments too. Memory: one ledger segment (at most 500 lines) plus a compact entry
        (`results.Finished`, a few hundred bytes) per Done shard, never the ledger's lines."""
        campaign, listed = results.campaign_and_shards(self.kube, self.namespace, self.campaign.name)
        folded = campaign.current_status.folded
        s3 = self.store if isinstance(self.store, S3Store) else None
        interval = campaign.spec.effective_heartbeat_seconds
        next_renewal = self.clock.monotonic() + interval

        def renew_when_due() -> None:
            nonlocal next_renewal
            if self.clock.monotonic() >= next_renewal:
                self.renew()
                next_renewal = self.clock.monotonic() + interval

        lines = 0
        try:
            work = results.work_shards(listed)
            # The ledger streams one segment at a time, the claim renewed between two when due.
            finished = results.finished_shards(
                campaign.name, work, folded, results.ledger_of(self.store, campaign, renew_when_due)
            )
            every_item = lambda: campaign_items(self.kube, campaign, s3)  # noqa: E731 - only if needed
            with path.open("w", encoding="utf-8") as out:
                for _, line in results.done_lines(results.read_verified(self.store), finished, every_item):
                    out.write(results.json_line(line) + "\n")
                    lines += 1
                    renew_when_due()
        except results.ResultsMismatch as mismatch:
            return ErrorClass.UNKNOWN, f"the campaign's results for the finalize shard: {mismatch}"
        except ItemsChanged as changed:
            return ErrorClass.INVALID_INPUT, f"the campaign's items for the finalize shard: {changed.message}"
        except (ItemsOverLimit, NotJsonlText) as refused:  # the operator refuses them before any shard
            return ErrorClass.INVALID_INPUT, f"the campaign's items for the finalize shard: {refused}"
        except ItemsUnavailable as problem:
            return ErrorClass.NOT_FOUND, f"the campaign's items for the finalize shard: {problem.message}"
        except OSError as error:
            return ErrorClass.UNKNOWN, f"cannot write the campaign's results file: {error}"
        emit("campaign-results-written", shard=self.name, lines=lines, shards=len(finished))
        return None

    def run_command(self, work: list[WorkItem]) -> Outcome:
        worker_spec = (self.finalize and self.campaign.spec.finalize) or self.campaign.spec.worker
        try:
            files = AttemptFiles.create(work, f"{self.name}-a{self.attempt}-", self.settings.work_dir)
        except OSError as error:
            return self.fail(
                ErrorClass.UNKNOWN, f"cannot write the attempt's files: {error}", self.claimed.source
            )
        # The protocol variables whose values are this shard's own (SHARD_VARIABLES, and the
        # optional ones below); a persistent command gets them with each shard's request, the
        # campaign's at its start.
        values = (
            str(files.items),
            str(files.results),
            str(files.error),
            self.claimed.source or "",
            self.name,
            str(self.attempt),
            self.key,
        )
        of_shard = dict(zip(SHARD_VARIABLES, values, strict=True))
        of_campaign = campaign_variables(self.campaign, worker_spec)
        if self.finalize:
            problem = self.write_campaign_results(files.campaign_results)
            if problem is not None:
                files.remove()
                return self.fail(problem[0], problem[1], self.claimed.source)
            of_shard["SHARDOPS_CAMPAIGN_RESULTS_FILE"] = str(files.campaign_results)
        if worker_spec.llm is not None and self.claimed.source is not None:
            # The built-in LLM worker reads its source's cooldown from this file before each request.
            self.cooldown_file = files.directory / COOLDOWN_FILE
            self.write_cooldown()
            of_shard[COOLDOWN_FILE_ENV] = str(self.cooldown_file)
        argv = worker_spec.full_command()
        env = command_env(os.environ, {**of_campaign, **of_shard}, worker_spec.env_dict())
        command: ShardCommand
        if self.persistent:
            command = ServedCommand(self.slot.commands, argv, env, frozenset(of_shard), self.name)
        else:
            command = Command(argv, env, files.directory)
        reader = ResultsReader(files.results, [w.key for w in work], self.store.max_bytes)
        try:
            command.start()
            self.command_started(command, len(work))
            return self.supervise(command, reader, files, len(work))
        except CommandFailure as failure:
            command.kill()
            self.command_outcome = self.command_outcome or CommandOutcome.FAILED
            return self.fail(failure.error_class, failure.message, self.claimed.source)
        finally:
            command.kill()
            seconds = command.seconds()
            # A command that never started has no run time (its shard counts as failed, by class).
            if seconds is not None:
                outcome = self.command_outcome or CommandOutcome.ERROR
                self.slot.metrics.observe_command(self.shard.spec.shard_class, outcome, seconds)
            if not self.settings.keep_work_dir:
                files.remove()

    def command_started(self, command: ShardCommand, items: int) -> None:
        """Log the start of the shard's command and count a process started for it (a persistent
        command's process is started for the first shard it serves, or when it was replaced)."""
        if command.new_process:
            mode = CommandMode.PERSISTENT if self.persistent else CommandMode.PER_SHARD
            self.slot.metrics.observe_command_start(mode)
        served = (
            {"persistent": True, "new_process": command.new_process, "replaced": command.replaced}
            if isinstance(command, ServedCommand)
            else {}
        )
        emit("command-started", shard=self.name, pid=command.pid, items=items, attempt=self.attempt, **served)

    def supervise(
        self, command: ShardCommand, reader: ResultsReader, files: AttemptFiles, count: int
    ) -> Outcome:
        interval = self.campaign.spec.effective_heartbeat_seconds
        next_beat = self.clock.monotonic() + interval
        shutdown = False
        while True:
            self.tally.absorb(reader.poll())
            if command.poll() is not None:
                break
            if self.slot.stop.is_set():
                shutdown = True
                emit(
                    "stopping-command",
                    shard=self.name,
                    pid=command.pid,
                    grace=self.settings.term_grace_seconds,
                )
                command.terminate(self.settings.term_grace_seconds)
                break
            if self.clock.monotonic() >= next_beat:
                next_beat = self._beat(command, interval)
            # A tick, cut short by the command's end (its exit, its answer): a shard's slot goes on
            # to its next claim at once, not up to a tick later.
            command.wait(self.settings.tick_seconds)
        code = command.poll()
        # A last line cut short is an error only from a command that claims success (exit 0); one that
        # crashed or was stopped simply did not finish that item.
        self.tally.absorb(reader.finish(tolerate_partial=command.signalled or code != 0))
        missing = len(self.tally.remaining())
        if code == 0 and not missing:
            self.command_outcome = CommandOutcome.SUCCEEDED
        else:
            self.command_outcome = CommandOutcome.STOPPED if shutdown else CommandOutcome.FAILED
        emit(
            "command-exited",
            shard=self.name,
            code=code,
            results=count - missing,
            missing=missing,
            seconds=command.seconds(),
        )
        if shutdown and (code != 0 or missing):
            return self.release()
        if code == 0:
            if missing:
                raise CommandFailure(
                    ErrorClass.BAD_OUTPUT,
                    f"command exited 0 but wrote results for {count - missing} of {count} item(s); "
                    "exit 0 means every item has a result line",
                )
            return self.complete(None, reused=False)
        classified = classify_failure(code or 0, read_error_file(files.error), self.claimed.source)
        assert classified is not None  # code != 0
        return self.fail(
            classified.error_class, classified.message, classified.source, classified.retry_after_seconds
        )

    def _beat(self, command: ShardCommand, interval: float) -> float:
        """Heartbeat; returns when the next one is due. Fenced propagates after killing the command."""
        metrics = self.slot.metrics
        try:
            self.heartbeat()
            self.refresh_cooldown()
        except Fenced:
            metrics.observe_heartbeat(HeartbeatOutcome.FENCED)
            self.command_outcome = CommandOutcome.FENCED
            command.kill()
            raise
        except ResultTooLarge as too_large:
            raise CommandFailure(ErrorClass.RESULT_TOO_LARGE, str(too_large)) from None
        except TRANSIENT_ERRORS as error:
            metrics.observe_heartbeat(HeartbeatOutcome.FAILED)
            if self.clock.now() >= self.lease.until:
                # We could not renew before the lease ran out: someone may hold it now. Stop, write
                # nothing; if nobody took over, the next claim resumes from our last flush.
                self.command_outcome = CommandOutcome.FENCED
                command.kill()
                raise Fenced(
                    f"lease ran out while the API server was unreachable ({error})", FenceReason.EXPIRED
                ) from error
            log.warning("%s: heartbeat failed, retrying: %s", self.name, error)
            return self.clock.monotonic() + _HEARTBEAT_RETRY_SECONDS
        metrics.observe_heartbeat(HeartbeatOutcome.OK)
        return self.clock.monotonic() + interval

    # --- the source's cooldown (the built-in LLM worker) ------------------------------------------

    def refresh_cooldown(self) -> None:
        """Mid-shard, another worker's 429 reaches this one through the Campaign's
        status.sourceCooldowns (the operator records it): one GET per heartbeat, only for a shard whose
        command reads the cooldown file. Trouble reading it is not the heartbeat's: the next one retries."""
        if self.cooldown_file is None:
            return
        try:
            campaign = Campaign.parse_items_counted(
                self.kube.get(CAMPAIGNS, self.namespace, self.campaign.name)
            )
        except TRANSIENT_ERRORS as error:
            # NotFound is an ApiError: a deleted campaign ends the shard by other ways.
            log.warning("%s: could not read the campaign's source cooldowns: %s", self.name, error)
            return
        self.cooldowns = cooldowns.later(self.cooldowns, cooldowns.recorded(campaign, self.clock.now()))
        self.shares = {entry.source: entry for entry in campaign.current_status.source_shares}
        try:
            self.write_cooldown()
        except OSError as error:
            log.warning("%s: could not write the cooldown file: %s", self.name, error)

    def write_cooldown(self) -> None:
        """The cooldown of the shard's source as {source, until (epoch seconds), shard}, or {} for none,
        and the campaign's share of it when it is a shared Source (`share`)."""
        if self.cooldown_file is None:
            return
        found = self.cooldowns.get(self.claimed.source or "")
        body: dict[str, object] = (
            {"source": found.source, "until": found.until.timestamp(), "shard": found.shard}
            if found is not None
            else {}
        )
        shares = self.shares
        if shares is None:
            shares = {entry.source: entry for entry in self.campaign.current_status.source_shares}
        share = shares.get(self.claimed.source or "")
        if share is not None:
            rates = Rates.from_limits(share).dimensions()
            body[COOLDOWN_FILE_SHARE_KEY] = dict(zip(COOLDOWN_FILE_SHARE_RATES, rates, strict=True))
        temporary = self.cooldown_file.with_suffix(".tmp")
        temporary.write_text(json.dumps(body), encoding="utf-8")
        temporary.replace(self.cooldown_file)
