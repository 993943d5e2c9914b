"""What README.md and docs/*.md say about the command line stays true: every ``shmq ...``
they show names commands that exist, with flags those commands have; every command line
written to be run parses (click's parser, nothing executed); every column their
``$ shmq stats`` and ``$ shmq top --once`` examples show is in that command's output, on
both transports.

The claims are found by their form, not by where they are (the pages get rewritten):
the lines of ``sh``/``bash``/``console`` code blocks and the ``$ `` lines of other
non-Python blocks, and the inline code spans that start with ``shmq``. A line or span
in synopsis form (``[--json]``, ``create|list``, ``NAME...``) is checked for its
commands and flags; any other line is parsed whole.
"""

import glob
import os
import re
import shlex
import textwrap

import click
import pytest

from shmq.cli import main
from tests.test_cli import shmq_cli, target  # noqa: F401  (the fixture: local and tcp)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGES = ["README.md", *sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "*.md")))]
SHELL = {"sh", "bash", "console", "shell"}
FENCE = re.compile(r"^([ \t]*)```(\w*)\n(.*?)^\1```", re.S | re.M)  # (fences indented in a list too)
SPAN = re.compile(r"`([^`\n]+(?:\n[^`\n]+)*)`")  # inline code, possibly wrapped over lines
FLAG = re.compile(r"(?<![\w-])(--?[A-Za-z0-9][\w-]*)")
SYNOPSIS = re.compile(r"[\[\]()]|\.\.\.|\w\|\w|\|\w|\w\|")
STOP = {"|", "||", "&", "&&", ";", ">", ">>", "<", "2>", "2>&1"}


def _text(page):
    with open(os.path.join(ROOT, page), encoding="utf-8") as f:
        return f.read()


def _blocks(text):
    """(language, text) of each fenced code block, its indent removed."""
    return [(lang, textwrap.dedent(body)) for _indent, lang, body in FENCE.findall(text)]


def _shmq_args(line):
    """The arguments after ``shmq`` (``.venv/bin/shmq``, ``python -m shmq``) in one shell
    line, up to a pipe, ``&`` or ``;``; None when the line runs no shmq."""
    lex = shlex.shlex(line, posix=True, punctuation_chars=True)
    lex.whitespace_split = True
    try:
        tokens = list(lex)
    except ValueError:  # an unbalanced quote: not a shell line
        return None
    for i, tok in enumerate(tokens):
        if tok in ("shmq", "shmq.cli") or tok.endswith("/shmq"):
            args = []
            for t in tokens[i + 1:]:
                if t in STOP:
                    break
                args.append(t)
            return args
    return None


def claims():
    """(page, the text as written, its arguments after ``shmq``, runnable) for each
    command line or span of every page."""
    out = []
    for page in PAGES:
        text = _text(page)
        for lang, body in _blocks(text):
            if lang == "python":
                continue
            for line in body.splitlines():
                if lang not in SHELL:
                    if not line.startswith("$ "):
                        continue
                    line = line[2:]
                args = _shmq_args(line)
                if args is not None:
                    out.append((page, line.strip(), args, not SYNOPSIS.search(line.split("#")[0])))
        prose = FENCE.sub("", text)
        for span in SPAN.findall(prose):
            span = " ".join(span.split())
            if re.match(r"(\S*/)?shmq [a-z-]", span):
                out.append((page, span, span.split()[1:], False))
    return out


CLAIMS = claims()


def _resolve(args, where):
    """(the commands named, the context above them, the arguments left) for ``shmq
    ARGS``: alternatives (``create|list``) name several; fails, saying ``where``, for a
    name that is no command."""
    ctx = click.Context(main, info_name="shmq")
    cmd, i = main, 0
    while isinstance(cmd, click.Group) and i < len(args) and not args[i].startswith("-"):
        names = args[i].split("|")
        found = [cmd.get_command(ctx, name) for name in names]
        missing = [n for n, c in zip(names, found) if c is None]
        assert not missing, f"{where}: {ctx.command_path} has no command {' or '.join(missing)}"
        if len(found) > 1:
            return found, ctx, args[i + 1:]
        ctx = click.Context(found[0], info_name=names[0], parent=ctx)
        cmd, i = found[0], i + 1
    return [cmd], ctx.parent or ctx, args[i:]


def _flags(cmd, ctx):
    ctx = click.Context(cmd, info_name=cmd.name, parent=ctx)
    names = {"--help"}
    for p in cmd.get_params(ctx):
        if isinstance(p, click.Option):
            names.update(p.opts + p.secondary_opts)
    return names


def test_the_pages_make_claims():
    # the guard of the tests below: they find what the pages show (the README's first use,
    # the synopses of docs/OPERATIONS.md)
    readme = [c for c in CLAIMS if c[0] == "README.md"]
    assert sum(run for *_, run in readme) >= 5
    operations = [c for c in CLAIMS if c[0] == os.path.join("docs", "OPERATIONS.md")]
    assert sum(not run for *_, run in operations) >= 20
    assert any(c[1].startswith("shmq consume NAME") for c in operations)


@pytest.mark.parametrize("page,text,args", [c[:3] for c in CLAIMS], ids=[f"{c[0]}: {c[1][:60]}" for c in CLAIMS])
def test_every_command_named_exists_with_the_flags_named(page, text, args):
    commands, ctx, rest = _resolve(args, f"{page}: `{text}`")
    known = set().union(*(_flags(c, ctx) for c in commands))
    flags = [f for f in FLAG.findall(" ".join(rest)) if not re.fullmatch(r"-\d+", f) or f == "-0"]
    assert [f for f in flags if f not in known] == [], f"{page}: `{text}`: no such flag on {commands[0].name}"


RUNNABLE = [c for c in CLAIMS if c[3]]


@pytest.mark.parametrize("page,text,args", [c[:3] for c in RUNNABLE], ids=[f"{c[0]}: {c[1][:60]}" for c in RUNNABLE])
def test_every_command_line_to_run_parses(page, text, args):
    (cmd,), ctx, rest = _resolve(args, f"{page}: `{text}`")
    try:
        cmd.make_context(cmd.name, list(rest), parent=ctx).close()  # parses and converts; runs nothing
    except click.exceptions.Exit:  # --help, --version
        pass
    except click.ClickException as e:
        pytest.fail(f"{page}: `{text}`: {e.format_message()}")


# ---------------------------------------------------------------- the columns shown
def _tables(text):
    """{first header cell: header cells} of the tables in a plain-text output: blocks of
    lines, each headed by a line of cells two spaces apart at least."""
    out = {}
    for block in re.split(r"\n\s*\n", text):
        lines = [line for line in block.splitlines() if line.strip() and not line.startswith("shmq ")]
        if lines:
            header = re.split(r"\s{2,}", lines[0].strip())
            out[" ".join(header[:2]) if header[:2] == ["stream", "group"] else header[0]] = header
    return out


def _examples(command):
    """The tables of every ``$ shmq COMMAND`` example output in the pages."""
    found = []
    for page in PAGES:
        for lang, body in _blocks(_text(page)):
            if lang not in SHELL | {"python"} and body.startswith(f"$ shmq {command}\n"):
                found.append((page, _tables(body.split("\n", 1)[1])))
    return found


@pytest.fixture
def known(broker):
    """A queue with a dead-letter queue holding a message, a stream with a group: every
    table ``stats`` and ``top`` draw, with the ``dlq`` column."""
    broker.create_queue("orders-dlq")
    q = broker.create_queue("orders", dead_letter_queue="orders-dlq", visibility_timeout=300)
    q.put_many([b"order"] * 3)
    q.get().reject()
    s = broker.create_stream("clicks", partitions=2, max_bytes=1 << 16)
    s.append_many([b"click"] * 4, partition=1)
    with s.consumer("billing") as c:
        c.commit({1: 1})
    yield
    s.close()


@pytest.mark.parametrize("command", ["stats", "top --once --interval 0.1"])
def test_every_column_an_example_shows_is_in_the_output(command, known, target):  # noqa: F811
    examples = _examples(command.split(" --interval")[0])
    assert examples, f"no `$ shmq {command}` example in the pages"  # (the guard)
    r = shmq_cli(*command.split(), *target)
    assert (r.returncode, r.stderr) == (0, ""), r.stderr
    shown = _tables(r.stdout)
    for page, tables in examples:
        assert tables, page
        for first, header in tables.items():
            assert first in shown, f"{page}: `shmq {command}` shows no {first!r} table:\n{r.stdout}"
            assert [c for c in header if c not in shown[first]] == [], \
                f"{page}: `shmq {command}` has not these columns:\n{r.stdout}"
