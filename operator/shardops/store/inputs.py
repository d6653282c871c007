"""An input file of items checked line by line as it streams by: the one check behind
`kubectl campaign apply --items` and the Batch API's file upload, with the operator's line-numbered
errors. Nothing here reads or writes: the caller feeds the lines."""

from __future__ import annotations

from shardops.api.items import parse_item_line
from shardops.api.openai_batch import CustomIds
from shardops.logic.shard_items import ShardItemsSize


class InputCheck:
    """Every line a JSON object, every shard (`shard_size` items) small enough for its Shard, and with
    `batch` (llm format openai-batch) every line an OpenAI batch input line whose custom_id no earlier
    line has (that set is as large as the file: the check is kept where a file is checked whole)."""

    def __init__(self, where: str, shard_size: int, batch: bool) -> None:
        self.where = where
        self.items = 0
        self.lines = 0
        self._sizes = ShardItemsSize(shard_size, where)
        self._custom_ids = CustomIds() if batch else None

    def add(self, line: str) -> None:
        """The next line; ValueError naming the file and the line when it is wrong."""
        self.lines += 1
        item = parse_item_line(line, self.lines, self.where)
        if item is None:
            return
        if self._custom_ids is not None:
            self._custom_ids.check(item, self.lines, self.where)
        self._sizes.add(item)
        self.items += 1
