"""What every `kubectl campaign` command is handed (the parsed flags, a client made on first use, where to
print, the clock) and the reads several commands share: a Campaign and its Shards, parsed."""

from __future__ import annotations

import argparse
import datetime as dt
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, TextIO

from pydantic import ValidationError

from shardops.api.campaign import Campaign
from shardops.api.common import JSON
from shardops.api.shard import Shard
from shardops.cli.campaign_client import Client, bad_state, default_namespace
from shardops.cli.campaign_summary import parse_shards
from shardops.cli.text import as_json, as_yaml
from shardops.state import ledger, shardview


class View(Protocol):
    def as_dict(self) -> JSON: ...


@dataclass
class Context:
    """What a command needs: a client (made on first use), where to print, and the clock."""

    args: argparse.Namespace
    make_client: Callable[[], Client]
    stdout: TextIO
    stderr: TextIO
    clock: Callable[[], dt.datetime]
    _client: Client | None = None

    @property
    def client(self) -> Client:
        if self._client is None:
            self._client = self.make_client()
        return self._client

    @functools.cached_property
    def namespace(self) -> str:
        namespace: str | None = self.args.namespace
        return namespace or default_namespace(self.args.kubeconfig, self.args.context)

    @property
    def output(self) -> str:
        return str(self.args.output)

    def out(self, text: str) -> None:
        self.stdout.write(text if text.endswith("\n") else text + "\n")
        self.stdout.flush()

    def err(self, text: str) -> None:
        self.stderr.write(text if text.endswith("\n") else text + "\n")
        self.stderr.flush()

    def show(self, view: View, human: Callable[[Any], str]) -> None:
        self.out(formatted(self.output, view, human))


def formatted(output: str, view: View, human: Callable[[Any], str]) -> str:
    if output == "json":
        return as_json(view.as_dict())
    if output == "yaml":
        return as_yaml(view.as_dict())
    return human(view)


def parse_campaign(body: JSON) -> Campaign:
    try:
        return Campaign.parse(body)
    except ValidationError as error:
        name = (body.get("metadata") or {}).get("name")
        first = error.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ()))
        raise bad_state(
            f"campaign {name} does not parse ({where}: {first.get('msg')}); "
            f"see kubectl get campaign {name} -o yaml"
        ) from None


def load(ctx: Context, name: str) -> tuple[JSON, Campaign, list[JSON], list[Shard]]:
    """The Campaign and its live Shards (one list call, by label), as stored and parsed. Shards
    already folded into the ledger are counted by the status (status.folded), not listed again. The
    Shards are listed first, for the reason `results.campaign_and_shards` gives (this reads through
    the CLI's client, which names what it could not read)."""
    namespace = ctx.namespace
    shard_bodies = ctx.client.list_shards(namespace, name)
    body = ctx.client.get_campaign(namespace, name)
    campaign = parse_campaign(body)
    try:
        shards = parse_shards(shard_bodies)
    except ValueError as error:
        raise bad_state(str(error)) from None
    live = ledger.unfolded(shardview.of_campaign(shards, campaign), campaign.current_status.folded)
    if len(live) != len(shards):
        names = {s.name for s in live}
        shard_bodies = [b for b in shard_bodies if (b.get("metadata") or {}).get("name") in names]
    return body, campaign, shard_bodies, live
