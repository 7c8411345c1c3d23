"""The broker's side of the run-time contract: manifests the wrapper accepts, files packed the same way twice."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from pydantic import SecretStr

from broker.config import RuntimeConfig
from broker.specs import parse_spec_text
from providers.runtime.manifest import RunRequest, build_manifest, encode_blob, pack_files, wrapper_source


def test_files_pack_deterministically() -> None:
    files = {"b.py": "print(2)\n", "a/c.txt": "x"}
    assert pack_files(files) == pack_files(dict(reversed(list(files.items()))))
    assert pack_files(files) != pack_files({**files, "b.py": "print(3)\n"})


def test_a_run_request_keeps_its_secrets_out_of_reprs_and_dumps() -> None:
    spec = parse_spec_text("name: a\ngpu: H100:1\nworkload: {hours: 1}\nsecrets: [TOKEN]\n")
    run = RunRequest.for_launch(spec, job_id="j1", attempt=1, secrets={"TOKEN": SecretStr("hunter2-hunter2")},
                                runtime=RuntimeConfig())
    assert "hunter2" not in repr(run) and "hunter2" not in run.model_dump_json()
    assert run.secret_values() == {"TOKEN": "hunter2-hunter2"}


def test_a_built_manifest_runs_in_the_shipped_wrapper(tmp_path: Path) -> None:
    spec = parse_spec_text(
        "name: a\ngpu: H100:2\nworkload: {hours: 1}\nenv: {MODE: train}\nsecrets: [TOKEN]\n"
        "command: python3 main.py; echo \"$LOCKSTEP_JOB_ID/$LOCKSTEP_ATTEMPT $MODE\"\n"
        "files:\n  main.py: \"import os; print('tok', os.environ['TOKEN'] == 'abcd-1234-efgh')\"\n")
    run = RunRequest.for_launch(spec, job_id="j9", attempt=2, secrets={"TOKEN": SecretStr("abcd-1234-efgh")},
                                runtime=RuntimeConfig())
    manifest = build_manifest(run, rendezvous={"mode": "single"}, workdir=str(tmp_path / "w"),
                              logs={"file": str(tmp_path / "rank-{rank}.log"), "status_dir": str(tmp_path)},
                              checkpoint_dir=str(tmp_path / "ckpt"))
    script = tmp_path / "wrapper.py"
    script.write_text(wrapper_source())
    env = {"PATH": "/usr/bin:/bin", "LOCKSTEP_MANIFEST": encode_blob(manifest)}
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    log = (tmp_path / "rank-0.log").read_text()
    assert " out tok True" in log and " out j9/2 train" in log
    assert "abcd-1234-efgh" not in log
    assert (tmp_path / "ckpt").is_dir()
    assert json.loads((tmp_path / "status-0.json").read_text())["exit_code"] == 0
