"""The docs name only what exists (issue 29.5): every `lockstep` command and flag in README.md and docs/*.md,
every route in docs/api.md, every test file the docs cite.

Commands and flags are looked up in the command tree of the real typer app (each command's module loaded
once, no subprocess; typer carries its own click, so groups and options are told apart by what they do);
routes in the /openapi.json of the real aiohttp app, built in-process over the bundled catalog.
A failure lists every missing name with the file and line that names it, so a drift is one edit away.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import typer
from aiohttp.test_utils import TestServer

from broker.api import create_app
from broker.cli import app as lockstep_app
from broker.cli.app import LazyGroup, load
from broker.config import Settings
from broker.service import Lockstep
from providers.catalog import CatalogProvider

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^\s*(```|~~~)")
INLINE = re.compile(r"`([^`\n]+)`")
# `lockstep` where a shell runs it: first on the line (after a prompt or VAR=value words), or after a pipe,
# `;`, `&&` or `$(`; not a namespace (`-n lockstep`), a path, a package or a word like lockstep-<id>.
MENTION = re.compile(r"(?:^\s*(?:\$\s+)?(?:[A-Za-z_]\w*=\S*\s+)*|[;&|(]\s*)lockstep\s+(\S.*)")
COMMENT = re.compile(r"(^|\s)#.*$")  # a shell comment (what it says about commands is prose)
SHELL_END = {"|", "||", "&&", ";", ">", ">>", "2>", "2>&1", "#", "&", "\\"}
ROUTE = re.compile(r"\b(GET|POST|PUT|PATCH|DELETE)\s+`?(/[^\s`|),]*)")
PATH = re.compile(r"(?<![\w.-])(/v1/[^\s`'\"|),]*)")
TEST_FILE = re.compile(r"`(tests/[\w/]+\.py)`")


def code_lines(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, code) for every line of a fenced block (continuations joined) and every inline code span."""
    fenced, held, held_at = False, "", 0
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if fenced:
            if line.rstrip().endswith("\\"):
                held, held_at = held + line.rstrip()[:-1] + " ", held_at or n
                continue
            yield (held_at or n), COMMENT.sub("", held + line)
            held, held_at = "", 0
        else:
            for span in INLINE.findall(line):
                yield n, span


def _is_group(command: Any) -> bool:
    return hasattr(command, "get_command") and hasattr(command, "list_commands")


def _params(command: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for p in command.params:
        for opt in [*getattr(p, "opts", []), *getattr(p, "secondary_opts", [])]:
            if opt.startswith("-"):
                out[opt] = p
    return out


def _sub(group: Any, ctx: typer.Context, name: str) -> Any:
    command = group.get_command(ctx, name)
    if isinstance(group, LazyGroup) and name in LazyGroup.commands_table:
        command = load(LazyGroup.commands_table[name])  # the real command behind the deferred entry
    return command


def _takes_value(param: Any, word: str) -> bool:
    """Whether ``word`` (an option) is followed by its value."""
    return "=" not in word and not getattr(param, "is_flag", True) and not getattr(param, "count", False)


def check_invocation(root: Any, words: list[str]) -> list[str]:
    """What ``lockstep WORDS…`` names that the CLI lacks (empty when all of it exists)."""
    problems: list[str] = []
    command = root
    ctx = typer.Context(root, info_name="lockstep")
    path = ["lockstep"]
    i = 0
    while i < len(words):
        word = words[i].strip("[](),.;:'\"")
        if words[i] in SHELL_END or word.startswith("#") or not word:
            break
        if word.startswith("-") and len(word) > 1 and not set(word) <= {"-"}:
            flag = word.split("=", 1)[0]
            params = _params(command)
            if flag not in params and flag not in ("--help", *ctx.help_option_names):
                problems.append(f"`{' '.join(path)}` has no option {flag}")
            elif _takes_value(params[flag], word) if flag in params else False:
                i += 1  # the option's value
        elif _is_group(command):
            alternatives = word.split("|")
            if not all(re.fullmatch(r"[a-z][a-z0-9-]*", a) for a in alternatives):
                break  # a placeholder (FILE, JOB.yaml, …), not a command name
            found = [_sub(command, ctx, a) for a in alternatives]
            missing = [a for a, c in zip(alternatives, found, strict=True) if c is None]
            if missing:
                problems.extend(f"`{' '.join(path)}` has no command {a!r}" for a in missing)
                break
            command = found[0]
            ctx = typer.Context(command, info_name=alternatives[0], parent=ctx)
            path.append(word)
        # else: an argument of a leaf command
        i += 1
    return problems


def cli_problems() -> list[str]:
    root = typer.main.get_command(lockstep_app)
    assert _is_group(root)
    problems: list[str] = []
    seen: set[str] = set()
    for doc in DOCS:
        for n, code in code_lines(doc):
            for m in MENTION.finditer(code):
                rest = m.group(1)
                if rest.split()[0].endswith(":"):
                    continue  # a message's prefix ("lockstep: …"), not an invocation
                for problem in check_invocation(root, rest.split()):
                    line = f"{doc.relative_to(ROOT)}:{n}: {problem}"
                    if line not in seen:
                        seen.add(line)
                        problems.append(line)
    return problems


def test_every_command_and_flag_the_docs_name_exists() -> None:
    problems = cli_problems()
    assert not problems, "commands or flags named in the docs that `lockstep` lacks:\n" + "\n".join(problems)


def test_the_checker_sees_a_missing_command_and_flag() -> None:
    """The check above could fail: names that do not exist are reported, names that do are not."""
    root = typer.main.get_command(lockstep_app)
    assert _is_group(root)
    assert check_invocation(root, "quote --json examples/x.yaml".split()) == []
    assert check_invocation(root, "--db x.db tenants list".split()) == []
    assert check_invocation(root, "quote --frobnicate FILE".split()) == ["`lockstep quote` has no option --frobnicate"]
    assert check_invocation(root, "tenants teleport".split()) == ["`lockstep tenants` has no command 'teleport'"]
    assert check_invocation(root, "quote|teleport FILE".split()) == ["`lockstep` has no command 'teleport'"]


def _template(path: str) -> re.Pattern[str]:
    return re.compile(re.sub(r"\\\{[^/]*?\\\}", "[^/]+", re.escape(path)) + "$")


def _doc_path(raw: str) -> tuple[str, bool]:
    """A documented path without its query, with placeholders as one segment; True when it ends in a wildcard."""
    path = raw.split("?", 1)[0].rstrip(".:;")
    wildcard = path.endswith("*")
    path = re.sub(r"\{[^/]*\}", "X", path.rstrip("*"))
    return path, wildcard


async def openapi_document() -> dict[str, Any]:
    svc = Lockstep(Settings(db_url="sqlite://"), providers={"catalog": CatalogProvider()})
    server = TestServer(create_app(svc, start_loops=False))
    await server.start_server()
    try:
        async with httpx.AsyncClient(base_url=str(server.make_url(""))) as client:
            r = await client.get("/openapi.json")
        assert r.status_code == 200, r.text
        doc: dict[str, Any] = r.json()
        return doc
    finally:
        await server.close()


def route_problems(doc: dict[str, Any], api_md: Path) -> list[str]:
    served = [(method.upper(), _template(path), path) for path, item in doc["paths"].items() for method in item]
    problems: list[str] = []
    name = api_md.relative_to(ROOT) if api_md.is_relative_to(ROOT) else api_md.name
    for n, line in enumerate(api_md.read_text(encoding="utf-8").splitlines(), 1):
        named = [(m.group(1), m.group(2)) for m in ROUTE.finditer(line)]
        named += [("", p) for p in PATH.findall(line) if not any(p.startswith(q) for _, q in named)]
        for method, raw in named:
            path, wildcard = _doc_path(raw)
            hits = [(m, t) for m, t, full in served
                    if (full.startswith(path) if wildcard else bool(t.match(path)))]
            if not hits:
                problems.append(f"{name}:{n}: {method + ' ' if method else ''}{raw} "
                                f"is not in /openapi.json")
            elif method and method not in {m for m, _ in hits}:
                problems.append(f"{name}:{n}: {method} {raw}: /openapi.json has it only as "
                                f"{', '.join(sorted({m for m, _ in hits}))}")
    return problems


async def test_every_route_docs_api_names_is_served() -> None:
    problems = route_problems(await openapi_document(), ROOT / "docs" / "api.md")
    assert not problems, "routes named in docs/api.md that the API lacks:\n" + "\n".join(problems)


def test_the_route_checker_sees_a_missing_route(tmp_path: Path) -> None:
    doc = {"paths": {"/v1/jobs/{job_id}": {"get": {}, "delete": {}}, "/v1/prices/history": {"get": {}}}}
    md = tmp_path / "api.md"
    md.write_text("GET /v1/jobs/{id}\nDELETE `/v1/jobs/{id}`\ncurl $S/v1/jobs/j18c?x=1\nGET /v1/prices/*\n"
                  "POST /v1/jobs/{id}\nGET /v1/events\n")
    assert [p.split(": ", 1)[1] for p in route_problems(doc, md)] == [
        "POST /v1/jobs/{id}: /openapi.json has it only as DELETE, GET", "GET /v1/events is not in /openapi.json"]


def test_the_test_files_the_docs_cite_exist() -> None:
    missing = [f"{doc.relative_to(ROOT)}:{n}: {cited}"
               for doc in DOCS for n, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1)
               for cited in TEST_FILE.findall(line) if not (ROOT / cited).exists()]
    assert not missing, "test files the docs cite that do not exist:\n" + "\n".join(missing)
