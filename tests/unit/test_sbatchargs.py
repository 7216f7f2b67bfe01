"""sbatch's grammar (`slurm.sbatchargs`): script headers and command lines read as sbatch reads them.

HEADERS is a table of script headers of the kinds users write, with the argv words sbatch 22.05.8
finds in each het component. Where sbatch is installed, `test_words_equal_real_sbatch` checks every
row against it: `sbatch -vvvv` prints each word it found ("Found in script, argument ...") and the
options of each component, then fails to reach a controller that is not there (a private
slurm.conf on a closed port: nothing is ever submitted).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from slurm_hetero.slurm.sbatchargs import (
    CommandLine,
    SbatchArgsError,
    component_options,
    parse_options,
    script_options,
    script_words,
    split_command_line,
    values,
)

SHEBANG = "#!/bin/bash\n"
HEADERS: list[tuple[str, str, list[list[str]]]] = [
    (
        "typical",
        SHEBANG + "#SBATCH --job-name=train\n#SBATCH --gres=gpu:a100_80g:2\n#SBATCH -N 2\n"
        "#SBATCH --ntasks-per-node=2\n#SBATCH --time=01:00:00\n\nmodule load cuda\n#SBATCH -p late\n",
        [["--job-name=train", "--gres=gpu:a100_80g:2", "-N", "2", "--ntasks-per-node=2", "--time=01:00:00"]],
    ),
    (
        "space-separated",
        SHEBANG + "#SBATCH --partition gpu\n#SBATCH -G 4\n#SBATCH -N2 --exclusive\n",
        [["--partition", "gpu", "-G", "4", "-N2", "--exclusive"]],
    ),
    (
        "quoted",
        SHEBANG + '#SBATCH --job-name="my job"\n#SBATCH -C \'a100|h100\'\n#SBATCH --comment "x # y"\n',
        [["--job-name=my job", "-C", "a100|h100", "--comment", "x # y"]],
    ),
    (
        "comments",
        SHEBANG + "# a comment\n#SBATCH -J x#y -t 5\n#SBATCH --gres=gpu:1 # one gpu\n##SBATCH -N 9\n",
        [["-J", "x", "--gres=gpu:1"]],
    ),
    (
        "indented and late",
        SHEBANG + "  #SBATCH -N 7\n#SBATCH -p a\nset -e\n#SBATCH -p b\n",
        [["-p", "a"]],
    ),
    (
        "escapes",
        SHEBANG + '#SBATCH -p q\\r -o o\\"x\n',
        [["-p", "qr", "-o", 'o"x']],
    ),
    (
        "empty word ends the line",
        SHEBANG + '#SBATCH -J "" -N 2\n#SBATCH --comment=c\n',
        [["-J", "--comment=c"]],
    ),
    (
        "het components",
        SHEBANG + "#SBATCH -p a --gres=gpu:a100_80g:1\n#SBATCH hetjob\n#SBATCH -p b --gpus=2\n"
        "#SBATCH  PackJob -N 3\n#SBATCH -p c\n",
        [["-p", "a", "--gres=gpu:a100_80g:1"], ["-p", "b", "--gpus=2"], ["-p", "c"]],
    ),
    (
        "het word later on a line ends it",
        SHEBANG + "#SBATCH -p a hetjob -N 3\n#SBATCH -n 2\n#SBATCH --comment=hetjob\n",
        [["-p", "a", "-n", "2", "--comment=hetjob"]],
    ),
    ("no header", "#!/bin/sh\nhostname\n", [[]]),
]


def header(name: str) -> str:
    return next(text for n, text, _ in HEADERS if n == name)


ERRORS = [
    ("unmatched quote", SHEBANG + "#SBATCH -J 'x\n", "unmatched '"),
    ("left-over word", SHEBANG + "#SBATCH -p q r\n", "invalid directive .*'r'"),
    ("missing value", SHEBANG + "#SBATCH -N\n", "requires an argument"),
    ("dos line breaks", "#!/bin/bash\r\n#SBATCH -N 2\r\nsrun hostname\r\n", "DOS line breaks"),
]


@pytest.mark.parametrize("name,text,words", HEADERS, ids=[h[0] for h in HEADERS])
def test_script_words(name: str, text: str, words: list[list[str]]) -> None:
    assert script_words(text) == words


@pytest.mark.parametrize("name,text,match", ERRORS, ids=[e[0] for e in ERRORS])
def test_headers_sbatch_refuses(name: str, text: str, match: str) -> None:
    with pytest.raises(SbatchArgsError, match=match):
        script_options(text)


def test_options_of_a_header() -> None:
    text = header("typical")
    (options,) = script_options(text)
    v = values(options)
    assert v["gres"] == "gpu:a100_80g:2" and v["nodes"] == "2" and v["ntasks-per-node"] == "2"
    assert values(script_options(header("space-separated"))[0]) == {
        "partition": "gpu",
        "gpus": "4",
        "nodes": "2",
        "exclusive": None,
    }


def test_getopt_forms() -> None:
    options, used = parse_options(["-vN2", "--ntasks-per-n", "4", "job.sh"])
    assert [(o.name, o.value) for o in options] == [
        ("verbose", None),
        ("nodes", "2"),
        ("ntasks-per-node", "4"),
    ]
    assert used == 3
    with pytest.raises(SbatchArgsError, match="ambiguous"):
        parse_options(["--gre=gpu:1"])  # sbatch: '--gres' '--gres-flags'
    with pytest.raises(SbatchArgsError, match="doesn't allow"):
        parse_options(["--hold=yes"])
    with pytest.raises(SbatchArgsError, match="unknown sbatch option --frobnicate"):
        parse_options(["--frobnicate", "job.sh"])
    assert values(parse_options(["--tres-per-task=gres/gpu:1"])[0]) == {"tres-per-task": "gres/gpu:1"}
    assert values(parse_options(["--future-option=1"])[0]) == {"future-option": "1"}
    assert parse_options(["--", "-weird.sh"])[1] == 1


def test_command_line_split() -> None:
    line = split_command_line(["-p", "a", ":", "-p", "b", "job.sh", "--lr", "1"])
    assert [values(c) for c in line.components] == [{"partition": "a"}, {"partition": "b"}]
    assert (line.script, line.script_args) == ("job.sh", ("--lr", "1"))
    wrap = split_command_line(["--wrap", "hostname", "-N", "1"])
    assert wrap.script is None and wrap.wraps
    assert split_command_line([]).script is None


def test_command_line_wins_and_applies_to_every_component() -> None:
    script = script_options(header("het components"))
    env = {"SBATCH_PARTITION": "envp", "SBATCH_GRES": "gpu:l40s:1"}
    once = component_options(script, env, split_command_line(["-p", "cmd", "job.sh"]))
    assert [values(c)["partition"] for c in once] == ["cmd", "cmd", "cmd"]
    assert [values(c)["gres"] for c in once] == ["gpu:l40s:1"] * 3  # environment over script
    each = component_options(script, {}, split_command_line(["-p", "x", ":", "--gpus=4", "job.sh"]))
    assert [values(c).get("partition") for c in each] == ["x", "b", "c"]
    assert [values(c).get("gpus") for c in each] == [None, "4", None]
    assert component_options([], {}, CommandLine(((),), "job.sh", ())) == [[]]


# --------------------------------------------------------------------- against the real sbatch
_FOUND = re.compile(r'Found in script, argument "(.*)"$')
ORACLE_CONF = (
    "ClusterName=oracle\nSlurmctldHost=localhost(127.0.0.1)\nSlurmctldPort=9\nAuthType=auth/none\n"
    "SelectType=select/cons_tres\nGresTypes=gpu\nMessageTimeout=1\n"
)


def real_sbatch_words(text: str, tmp: Path) -> list[list[str]] | str:
    """The words real sbatch finds per component, or its error line."""
    (tmp / "slurm.conf").write_text(ORACLE_CONF)
    (tmp / "job.sh").write_text(text)
    env = {"SLURM_CONF": str(tmp / "slurm.conf"), "PATH": "/usr/bin:/bin"}
    result = subprocess.run(
        ["sbatch", "-vvvv", str(tmp / "job.sh")], capture_output=True, text=True, env=env, timeout=30
    )
    components: list[list[str]] = [[]]
    for line in result.stderr.splitlines():
        found = _FOUND.search(line)
        if found:
            components[-1].append(found.group(1))
        elif "end of defined options" in line:
            components.append([])
        elif any(e in line for e in ("Invalid directive", "requires an argument", "DOS line breaks")):
            return line
    return components[:-1] if len(components) > 1 else components


@pytest.mark.skipif(shutil.which("sbatch") is None, reason="Slurm's sbatch is not installed")
@pytest.mark.parametrize("name,text,words", HEADERS, ids=[h[0] for h in HEADERS])
def test_words_equal_real_sbatch(name: str, text: str, words: list[list[str]], tmp_path: Path) -> None:
    assert real_sbatch_words(text, tmp_path) == words


@pytest.mark.skipif(shutil.which("sbatch") is None, reason="Slurm's sbatch is not installed")
@pytest.mark.parametrize("name,text,match", ERRORS[1:], ids=[e[0] for e in ERRORS[1:]])
def test_real_sbatch_refuses_too(name: str, text: str, match: str, tmp_path: Path) -> None:
    assert isinstance(real_sbatch_words(text, tmp_path), str)


# ------------------------------------------------------- --mem* and --cpus-per-gpu: script, variables, line
# (#SBATCH lines, SBATCH_* variables, command line) -> the values sbatch keeps, or its refusal
MEMORY_LAYERS = [
    (["--mem=100"], {"SBATCH_MEM_PER_NODE": "2000"}, [], {"mem": "2000"}),  # the variable over the script
    ([], {"SBATCH_MEM_PER_NODE": "2000"}, ["--mem=100"], {"mem": "100"}),  # the line over the variable
    (["--mem-per-cpu=100"], {"SBATCH_MEM_PER_NODE": "2000"}, [], {"mem-per-cpu": "100"}),  # drops it
    (
        [], {"SBATCH_MEM_PER_GPU": "9", "SBATCH_CPUS_PER_GPU": "3"}, ["--gpus=1"],
        {"mem-per-gpu": "9", "cpus-per-gpu": "3"},
    ),
    (["--mem=100"], {"SBATCH_MEM_PER_CPU": "7"}, ["--gpus=1"], {"mem": "100"}),
    (["--mem=100"], {"SBATCH_MEM_PER_NODE": "3", "SBATCH_MEM_PER_CPU": "7"}, [], "SLURM_MEM_PER_CPU"),
    ([], {"SBATCH_MEM_PER_GPU": "9", "SBATCH_MEM_PER_CPU": "7"}, [], "SLURM_MEM_PER_CPU"),
    ([], {"SBATCH_MEM_PER_GPU": "9", "SBATCH_MEM_PER_CPU": "7"}, ["--mem=5"], {"mem": "5"}),
]  # fmt: skip
_SHOWN = re.compile(r"^sbatch: ([a-z-]+) +: (.*)$")
SHOWN = ("mem", "mem-per-cpu", "mem-per-gpu", "cpus-per-gpu")


def _layered(directives: list[str], env: dict[str, str], line: list[str]) -> dict[str, str | None] | str:
    script = script_options("#!/bin/bash\n" + "".join(f"#SBATCH {d}\n" for d in directives) + "hostname\n")
    try:
        (options,) = component_options(script, env, split_command_line([*line, "job.sh"]))
    except SbatchArgsError as e:
        return str(e)
    return {k: v for k, v in values(options).items() if k in SHOWN}


@pytest.mark.parametrize("directives,env,line,kept", MEMORY_LAYERS)
def test_memory_variables_as_sbatch_layers_them(
    directives: list[str], env: dict[str, str], line: list[str], kept: dict[str, str] | str
) -> None:
    got = _layered(directives, env, line)
    assert got == kept if isinstance(kept, dict) else isinstance(got, str) and kept in got


@pytest.mark.skipif(shutil.which("sbatch") is None, reason="Slurm's sbatch is not installed")
@pytest.mark.parametrize("directives,env,line,kept", MEMORY_LAYERS)
def test_memory_variables_as_the_real_sbatch_keeps_them(
    directives: list[str], env: dict[str, str], line: list[str], kept: dict[str, str] | str, tmp_path: Path
) -> None:
    (tmp_path / "slurm.conf").write_text(ORACLE_CONF)
    (tmp_path / "job.sh").write_text("#!/bin/bash\n" + "".join(f"#SBATCH {d}\n" for d in directives) + "x\n")
    environ = {"SLURM_CONF": str(tmp_path / "slurm.conf"), "PATH": "/usr/bin:/bin", **env}
    result = subprocess.run(
        ["sbatch", "-vvvv", *line, str(tmp_path / "job.sh")],
        capture_output=True,
        text=True,
        env=environ,
        timeout=30,
    )
    shown = {m[1]: m[2] for m in map(_SHOWN.match, result.stderr.splitlines()) if m and m[1] in SHOWN}
    fatal = [text for text in result.stderr.splitlines() if "fatal:" in text]
    if fatal:  # the same refusal as `_layered`'s (test_memory_variables_as_sbatch_layers_them)
        assert isinstance(kept, str) and kept in fatal[0]
    else:
        assert shown == kept
