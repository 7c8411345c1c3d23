"""``lockstep quote FILE --json`` answered by a server or this store's background broker, before typer loads.

A quote is what scripts and sweeps run in loops, so its start-up is most of its cost: here the command
line is read by hand for that one form (``[--config F] [--db D] [--server U] [--token T] [--log-format X]
quote FILE --json [--top N]``), the file's data posted as it is, and the server's JSON printed. The
command's process loads no domain model, no offer book, no numpy, no typer.

Anything else — another form, no server and no broker up, a spec that needs the general path (a
``workdir`` to pack), any error, an answer with no option (exit 3 with the reasons) — returns False
having printed nothing, and the command runs the general way, which says what is wrong as it always does.
"""

from __future__ import annotations

import json
import os
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from broker.cli.localbroker import BrokerInfo

FAST_SPEC_BYTES = 65_536  # larger specs (packed workdirs, generated ones) take the general path
_GLOBAL = {"--config": "config", "--db": "db", "--server": "server", "--token": "token", "--log-format": None}


def _parse(argv: list[str]) -> dict[str, Any] | None:
    """The options of the one form handled here, or None for anything else."""
    opts: dict[str, Any] = {"top": 10}
    args = list(argv)
    while args and args[0] != "quote":
        head = args.pop(0)
        name, eq, value = head.partition("=")
        if name not in _GLOBAL:
            return None
        if not eq:
            if not args:
                return None
            value = args.pop(0)
        key = _GLOBAL[name]
        if key:
            opts[key] = value
    if not args:
        return None
    args.pop(0)  # "quote"
    files: list[str] = []
    json_out = False
    while args:
        head = args.pop(0)
        name, eq, value = head.partition("=")
        if head == "--json":
            json_out = True
        elif name == "--top":
            if not eq:
                if not args:
                    return None
                value = args.pop(0)
            if not value.isdigit() or not 1 <= int(value) <= 1000:
                return None
            opts["top"] = int(value)
        elif head.startswith("-"):
            return None  # --provider, --explain, --help, ...
        else:
            files.append(head)
    if not json_out or len(files) != 1:
        return None
    opts["file"] = files[0]
    return opts


def plain_spec(path: str) -> dict[str, Any] | None:
    """The file's data when it is a small plain spec the server can read as it is; None for anything else."""
    try:
        with open(path, "rb") as f:
            raw = f.read(FAST_SPEC_BYTES + 1)
    except OSError:
        return None
    if len(raw) > FAST_SPEC_BYTES:
        return None
    try:
        if path.endswith(".json"):
            data = json.loads(raw)
        else:
            import yaml

            data = yaml.load(raw, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except Exception:  # any parse failure: the general path reports it with its line and column
        return None
    if not isinstance(data, dict) or "workdir" in data or "files" in data:
        return None
    return data


def through_service(server: str | None, token: str | None, broker: BrokerInfo | None, path: str,
                    top: int) -> bool:
    """Print the quote's JSON as the server (or else ``broker``) made it; False, printing nothing, when neither
    is there, the spec needs the general path, or the answer has no option."""
    if not server and broker is None:
        return False
    data = plain_spec(path)
    if data is None:
        return False
    # Two optional imports this process never uses, which are most of httpx's import time: trio (httpcore
    # looks for it to serve trio programs; this is blocking code) and httpx's own command-line tool (rich,
    # click, pygments). Marked absent, their importers take their no-trio / no-CLI branch.
    for absent in ("trio", "httpx._main"):
        sys.modules.setdefault(absent, None)  # type: ignore[arg-type]
    from broker.sdk import Client

    if server:
        client = Client(server, token)
    else:
        assert broker is not None
        client = Client(broker.url, broker.token, retries=1)
    with client:
        raw = client.quote_json(data, top=top)
    answer = json.loads(raw)
    if not answer.get("options"):
        return False  # no feasible option: the general path explains why, grouped (exit 3)
    sys.stdout.write(json.dumps(answer, indent=2) + "\n")
    return True


def quote_json(argv: list[str]) -> bool:
    """Handle ``argv`` if it is the one form; True when the quote was printed."""
    opts = _parse(argv)
    if opts is None:
        return False
    try:
        from broker.cli.localbroker import db_url_from, quick

        server = opts.get("server", os.environ.get("LOCKSTEP_SERVER")) or None
        token = opts.get("token", os.environ.get("LOCKSTEP_TOKEN")) or None
        broker = None
        if not server:
            config = opts.get("config", os.environ.get("LOCKSTEP_CONFIG")) or None
            db = db_url_from(opts["db"]) if opts.get("db") else None
            broker = quick(config, db)
        return through_service(server, token, broker, opts["file"], opts["top"])
    except Exception:  # whatever went wrong, the general path does it again and says so properly
        return False
