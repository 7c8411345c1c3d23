"""deploy/Dockerfile: hadolint clean, multi-stage, non-root, a health check; a broken copy fails the lint.

No container engine runs on these machines, so the image is linted and read, not built.
"""

from __future__ import annotations

import re
from pathlib import Path

from tests.conftest import ROOT
from tests.deploy.tools import run, tool

DOCKERFILE = ROOT / "deploy" / "Dockerfile"


def stages(text: str) -> list[list[str]]:
    """The instructions of each stage (continuation lines joined, comments dropped)."""
    joined = re.sub(r"\\\n\s*", " ", text)
    out: list[list[str]] = []
    for line in joined.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.upper().startswith("FROM "):
            out.append([])
        if out:
            out[-1].append(line)
    return out


def test_hadolint_passes() -> None:
    r = run(tool("hadolint"), str(DOCKERFILE))
    assert r.returncode == 0, r.stdout + r.stderr


def test_a_broken_dockerfile_fails_hadolint(tmp_path: Path) -> None:
    broken = tmp_path / "Dockerfile"
    text = DOCKERFILE.read_text()
    # Root at run time with an unpinned apt install that leaves its lists behind: what the lint is for.
    text = text.replace("FROM base AS runtime",
                        "FROM base AS runtime\nUSER root\nRUN apt-get update && apt-get install -y curl")
    broken.write_text(text)
    r = run(tool("hadolint"), str(broken))
    assert r.returncode != 0
    for rule in ("DL3008", "DL3009", "DL3015", "DL3002"):
        assert rule in r.stdout, r.stdout


def test_the_final_stage_is_slim_non_root_and_checks_its_health() -> None:
    text = DOCKERFILE.read_text()
    all_stages = stages(text)
    assert len(all_stages) >= 2 and all_stages[0][0].endswith("AS build")
    # The default target (the last stage) builds on `base`; base installs only stage one's wheels.
    assert all_stages[-1] == ["FROM base AS runtime"]
    base = next(s for s in all_stages if s[0].endswith("AS base"))
    body = "\n".join(base)
    image = re.search(r"ARG PYTHON_IMAGE=(\S+)", text)
    assert image and "slim" in image.group(1)
    assert "from=build,source=/wheels" in body and "--no-index" in body and "--no-cache-dir" in body
    assert not re.search(r"apt-get|gcc|build-essential|COPY \. ", body), "no compiler or source in the final stage"
    (user,) = [line for line in base if line.startswith("USER ")]
    uid = user.split()[1].split(":")[0]
    assert uid.isdigit() and int(uid) > 0
    (health,) = [line for line in base if line.startswith("HEALTHCHECK ")]
    assert "/healthz" in health
    ignore = (ROOT / ".dockerignore").read_text().splitlines()
    assert "*" in ignore and "!broker/" in ignore, "the build context is only what the image needs"
