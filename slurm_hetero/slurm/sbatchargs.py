"""sbatch's own grammar: its command line and a script's `#SBATCH` header, read as sbatch reads them.
Pure: text and argv in, options out; `cli/sbatch.py` reads the script and runs sbatch. The rules
(measured on sbatch 22.05.8): docs/submit-protocol.md, "How sbatch reads a script's header"."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from slurm_hetero.core.errors import SbatchArgsError

# Long options of sbatch 22.05.8 by argument (measured: `sbatch --NAME` and `--NAME=x` for each name),
# plus those 24.11 added (container-id, segment, tres-bind, tres-per-task).
REQUIRED = frozenset(
    """account acctg-freq array batch bb bbf begin chdir cluster cluster-constraint clusters comment
    constraint container container-id core-spec cores-per-socket cpu-freq cpus-per-gpu cpus-per-task
    deadline delay-boot dependency distribution error exclude export export-file extra
    extra-node-info gid gpu-bind gpu-freq gpus gpus-per-node gpus-per-socket gpus-per-task gres
    gres-flags hint input job-name kill-on-invalid-dep licenses mail-type mail-user mcs-label mem
    mem-bind mem-per-cpu mem-per-gpu mincpus network nodefile nodelist nodes ntasks ntasks-per-core
    ntasks-per-gpu ntasks-per-node ntasks-per-socket open-mode output partition power prefer priority
    profile qos reservation segment signal sockets-per-node switches thread-spec threads-per-core
    time time-min tmp tres-bind tres-per-task uid wait-all-nodes wckey wrap""".split()
)
OPTIONAL = frozenset("exclusive get-user-env nice no-kill propagate".split())
FLAGS = frozenset(
    """contiguous help hold ignore-pbs no-requeue overcommit oversubscribe parsable quiet reboot
    requeue spread-job test-only usage use-min-nodes verbose version wait""".split()
)
LONG = REQUIRED | OPTIONAL | FLAGS
SHORT_REQUIRED = {
    "a": "array", "b": "begin", "c": "cpus-per-task", "d": "dependency", "e": "error",
    "i": "input", "m": "distribution", "n": "ntasks", "o": "output", "p": "partition", "q": "qos",
    "t": "time", "w": "nodelist", "x": "exclude", "A": "account", "B": "extra-node-info",
    "C": "constraint", "D": "chdir", "F": "nodefile", "G": "gpus", "J": "job-name",
    "L": "licenses", "M": "clusters", "N": "nodes", "S": "core-spec",
}  # fmt: skip
SHORT_FLAGS = {
    "h": "help", "k": "no-kill", "s": "oversubscribe", "v": "verbose", "H": "hold",
    "O": "overcommit", "Q": "quiet", "V": "version", "W": "wait",
}  # fmt: skip
# The environment variables sbatch reads for the options the wrapper looks at (measured; no SBATCH_NODES,
# _NTASKS, _CPUS_PER_TASK or _NODELIST exist, and 24.11's SBATCH_TRES_PER_TASK is not read).
ENV_OPTIONS = {
    "SBATCH_GRES": "gres",
    "SBATCH_GPUS": "gpus",
    "SBATCH_GPUS_PER_NODE": "gpus-per-node",
    "SBATCH_GPUS_PER_TASK": "gpus-per-task",
    "SBATCH_GPUS_PER_SOCKET": "gpus-per-socket",
    "SBATCH_PARTITION": "partition",
    "SBATCH_CONSTRAINT": "constraint",
    "SBATCH_CPUS_PER_GPU": "cpus-per-gpu",
    "SBATCH_MEM_PER_NODE": "mem",
    "SBATCH_MEM_PER_CPU": "mem-per-cpu",
    "SBATCH_MEM_PER_GPU": "mem-per-gpu",
}
# sbatch keeps one of them (slurm_opt.c _validate_memory_options): `_memory`, `sbatch.read_options`
MEMORY = ("mem", "mem-per-cpu", "mem-per-gpu")
MEMORY_VARIABLES = "SLURM_MEM_PER_CPU, SLURM_MEM_PER_GPU, and SLURM_MEM_PER_NODE are mutually exclusive."
MAGIC = "#SBATCH"
HET_WORDS = ("hetjob", "packjob")
_SPACE = " \t\n\r\f\v"  # C isspace()
_WORD = re.compile(f"[^{_SPACE}]*")


@dataclass(frozen=True)
class Option:
    """One option as written (`written`: its argv words) and read (`name`: the long name)."""

    name: str
    value: str | None
    written: tuple[str, ...]


# ------------------------------------------------------------------------------------- getopt
def _long_name(word: str) -> str:
    """The long option a `--word` means: the exact name, else its one unique prefix (getopt_long)."""
    if word in LONG:
        return word
    matches = sorted(n for n in LONG if n.startswith(word))
    if len(matches) > 1:
        raise SbatchArgsError(f"option '--{word}' is ambiguous; possibilities: --{' --'.join(matches)}")
    return matches[0] if matches else ""


def _long(args: Sequence[str], i: int) -> tuple[Option, int]:
    word, eq, value = args[i][2:].partition("=")
    name = _long_name(word)
    if not name:
        if eq:  # an option of a later release: passed on as written
            return Option(word, value, (args[i],)), i + 1
        raise SbatchArgsError(f"unknown sbatch option --{word}; if it takes a value, write --{word}=VALUE")
    if name in FLAGS and eq:
        raise SbatchArgsError(f"option '--{name}' doesn't allow an argument")
    if name in REQUIRED and not eq:
        if i + 1 >= len(args):
            raise SbatchArgsError(f"option '--{name}' requires an argument")
        return Option(name, args[i + 1], (args[i], args[i + 1])), i + 2
    return Option(name, value if eq else None, (args[i],)), i + 1


def _short(args: Sequence[str], i: int) -> tuple[list[Option], int]:
    word, out = args[i], []
    for pos in range(1, len(word)):
        letter = word[pos]
        if letter in SHORT_FLAGS:
            out.append(Option(SHORT_FLAGS[letter], None, (f"-{letter}",)))
            continue
        if letter not in SHORT_REQUIRED:
            raise SbatchArgsError(f"invalid option -- '{letter}'")
        name, rest = SHORT_REQUIRED[letter], word[pos + 1 :]
        if rest:
            out.append(Option(name, rest, (f"-{letter}{rest}",)))
            return out, i + 1
        if i + 1 >= len(args):
            raise SbatchArgsError(f"option requires an argument -- '{letter}'")
        out.append(Option(name, args[i + 1], (f"-{letter}", args[i + 1])))
        return out, i + 2
    return out, i + 1


def parse_options(args: Sequence[str]) -> tuple[list[Option], int]:
    """sbatch's getopt ("+": stop at the first word that is no option): the options, and the index
    of the first word not read (`--` is read and ends the options)."""
    options: list[Option] = []
    i = 0
    while i < len(args):
        word = args[i]
        if word == "--":
            return options, i + 1
        if not word.startswith("-") or word == "-":
            break
        if word.startswith("--"):
            option, i = _long(args, i)
            options.append(option)
        else:
            found, i = _short(args, i)
            options += found
    return options, i


# --------------------------------------------------------------------------------- command line
@dataclass(frozen=True)
class CommandLine:
    """`sbatch OPTS0 [: OPTS1 ...] [script [args...]]` split into its parts."""

    components: tuple[tuple[Option, ...], ...]
    script: str | None  # None: --wrap, or the script comes on stdin
    script_args: tuple[str, ...]

    @property
    def wraps(self) -> bool:
        return any(o.name == "wrap" for c in self.components for o in c)


def split_command_line(argv: Sequence[str]) -> CommandLine:
    """The het components' options, the script and its arguments of an sbatch command line."""
    components, rest = [], list(argv)
    while True:
        options, used = parse_options(rest)
        components.append(tuple(options))
        ended_by_dashes = used > 0 and rest[used - 1] == "--"
        rest = rest[used:]
        if not rest or rest[0] != ":" or ended_by_dashes:
            break
        rest = rest[1:]
    line = CommandLine(tuple(components), None, tuple(rest))
    return line if line.wraps or not rest else CommandLine(line.components, rest[0], tuple(rest[1:]))


# ------------------------------------------------------------------------------- #SBATCH lines
def _argument(line: str, start: int, where: str) -> tuple[str, int]:
    """One word of a directive from `start` (after whitespace): (text, end); text "" ends the line."""
    out: list[str] = []
    quote, escaped, i = "", False, start
    while i < len(line) and (quote or line[i] not in _SPACE):
        ch = line[i]
        i += 1
        if escaped:
            escaped = False
        elif ch == "\\":
            escaped = True
            continue
        elif quote:
            if ch == quote:
                quote = ""
                continue
        elif ch in "\"'":
            quote = ch
            continue
        elif ch == "#":
            return "".join(out), len(line)
        out.append(ch)
    if quote:
        raise SbatchArgsError(f"{where}: unmatched {quote} in [{line}]")
    return "".join(out), i


def directive_words(body: str, where: str) -> tuple[list[str], bool]:
    """The argv words of one directive (after `#SBATCH`) and whether it starts a het component."""
    words: list[str] = []
    i = 0
    while True:
        while i < len(body) and body[i] in _SPACE:
            i += 1
        if i >= len(body):
            return words, False
        first = _WORD.match(body, i)
        if first and first.group().lower() in HET_WORDS:
            return words, not words
        if body[i] == ":":
            raise SbatchArgsError(f"{where}: unexpected ':' in [{body}]")
        word, i = _argument(body, i, where)
        if not word:
            return words, False
        words.append(word)


def script_words(text: str, name: str = "script") -> list[list[str]]:
    """The `#SBATCH` argv of each het component of a script (one list when it has no `hetjob`)."""
    if "\r\n" in text:
        raise SbatchArgsError(f"{name}: DOS line breaks (\\r\\n); sbatch refuses them: convert with dos2unix")
    components: list[list[str]] = [[]]
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.startswith(MAGIC):
            if line.lstrip(_SPACE)[:1] not in ("", "#"):  # the first command: no directive after it
                break
            continue
        words, separator = directive_words(line[len(MAGIC) :], f"{name}: line {number}")
        if separator:
            components.append([])
        components[-1] += words
    return components


def script_options(text: str, name: str = "script") -> list[list[Option]]:
    """The options of each het component of a script's `#SBATCH` header."""
    out = []
    for words in script_words(text, name):
        options, used = parse_options(words)
        if used < len(words):
            raise SbatchArgsError(
                f"{name}: invalid directive in the #SBATCH header: {words[used]!r} (sbatch refuses it too)"
            )
        out.append(options)
    return out


# ------------------------------------------------------------------------------------ layering
def component_options(
    script: Sequence[Sequence[Option]], environ: Mapping[str, str], line: CommandLine
) -> list[list[Option]]:
    """Each het component's options in sbatch's order: script, environment, command line."""
    env = [Option(name, environ[var], ()) for var, name in ENV_OPTIONS.items() if environ.get(var)]
    return [
        _memory(script[k] if k < len(script) else (), env, component_group(line.components, k))
        for k in range(max(len(script), len(line.components), 1))
    ]


def component_group(groups: Sequence[Sequence[Option]], k: int) -> Sequence[Option]:
    """Het component k's command-line options: one group serves every component, several the k-th."""
    if len(groups) == 1:
        return groups[0]
    return groups[k] if k < len(groups) else ()


def _memory(own: Sequence[Option], env: Sequence[Option], cmd: Sequence[Option]) -> list[Option]:
    """The component's options as sbatch keeps them: a --mem* from a variable is dropped (its
    earlier script value with it) where another --mem* came from the script or command line; two
    --mem* variables alone are refused."""
    layered = [*(("line", o) for o in own), *(("env", o) for o in env), *(("line", o) for o in cmd)]
    source = {o.name: where for where, o in layered if o.name in MEMORY}
    from_env = {name for name, where in source.items() if where == "env"}
    if len(from_env) < len(source):
        return [o for _, o in layered if o.name not in from_env]
    if len(from_env) > 1:
        raise SbatchArgsError(f"sbatch refuses the job: {MEMORY_VARIABLES}")
    return [o for _, o in layered]


def values(options: Sequence[Option]) -> dict[str, str | None]:
    """Option name -> its last value (flags map to None)."""
    return {o.name: o.value for o in options}
