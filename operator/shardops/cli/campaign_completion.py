"""Shell completion of `kubectl campaign`: commands and flags, read from the parser itself.

Three ways in, one answer (`candidates`):
* `kubectl campaign <TAB>` through kubectl's own completion (kubectl 1.26+ runs the executable
  `kubectl_complete-campaign` on PATH, installed with shardops, and offers what it prints);
* `kubectl-campaign <TAB>`, once `source <(kubectl campaign completion bash)` (or zsh) has set it up;
* `kubectl-campaign __complete WORD...`, which both of the above call.
Campaign names are not offered: that would be an API call on every TAB; `kubectl get campaigns`.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import TextIO

SHELLS = ("bash", "zsh")
# The hidden first argument that asks for completions instead of running a command.
COMPLETE_COMMAND = "__complete"
# cobra's ShellCompDirectiveNoFileComp: kubectl offers no file names after a plugin's candidates.
NO_FILE_COMPLETION = ":4"

BASH = """\
# bash completion of kubectl-campaign (shardops): source <(kubectl campaign completion bash)
_kubectl_campaign() {
    local IFS=$'\\n'
    COMPREPLY=($(kubectl-campaign __complete "${COMP_WORDS[@]:1:COMP_CWORD}" 2>/dev/null))
}
complete -o default -F _kubectl_campaign kubectl-campaign
"""

ZSH = """\
#compdef kubectl-campaign
# zsh completion of kubectl-campaign (shardops): source <(kubectl campaign completion zsh)
_kubectl_campaign() {
    local -a found
    found=("${(@f)$(kubectl-campaign __complete "${(@)words[2,CURRENT]}" 2>/dev/null)}")
    compadd -a found
}
compdef _kubectl_campaign kubectl-campaign
"""


def _commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _flags(parser: argparse.ArgumentParser) -> list[str]:
    return sorted(
        option
        for action in parser._actions
        if action.help != argparse.SUPPRESS
        for option in action.option_strings
        if option.startswith("--") or len(option) == 2
    )


def candidates(parser: argparse.ArgumentParser, words: Sequence[str]) -> list[str]:
    """What may come next after `words` (the arguments typed so far; the last one is the partial
    word, "" right after a space): a command's name before one is given, else that command's flags
    when the partial starts with "-"; nothing where a value or a name of the user's goes."""
    partial = words[-1] if words else ""
    typed = list(words[:-1])
    commands = _commands(parser)
    command = next((word for word in typed if word in commands), None)
    if command is None:
        options = _flags(parser) if partial.startswith("-") else sorted(commands)
    elif partial.startswith("-"):
        options = _flags(commands[command])
    else:
        options = sorted(SHELLS) if command == "completion" and typed[-1:] == [command] else []
    return [option for option in options if option.startswith(partial)]


def script(shell: str) -> str:
    return BASH if shell == "bash" else ZSH


def print_candidates(
    parser: argparse.ArgumentParser, words: Sequence[str], out: TextIO, kubectl: bool
) -> int:
    for option in candidates(parser, words):
        print(option, file=out)
    if kubectl:
        print(NO_FILE_COMPLETION, file=out)
    return 0
