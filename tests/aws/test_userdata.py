"""The boot script EC2 instances get: the job's image and command, quoted, or nothing."""

from __future__ import annotations

import shlex

from providers.aws.requests import user_data
from tests.aws.conftest import job, launch_request
from tests.aws.test_stubbed import p4d_offer


def test_no_command_no_script() -> None:
    assert user_data(launch_request(p4d_offer(), 1)) is None


def test_script_runs_image_and_quoted_command() -> None:
    spec = job(gpu="A100", command="torchrun train.py --name 'a b'; echo done", image="nvcr.io/x:1")
    script = user_data(launch_request(p4d_offer(), 2, job_id="j-1", attempt=3, spec=spec))
    assert script is not None and script.startswith("#!/bin/bash\n")
    argv = shlex.split(script.strip().splitlines()[-1])
    assert argv[:3] == ["docker", "run", "--rm"] and "nvcr.io/x:1" in argv
    assert argv[-1] == "torchrun train.py --name 'a b'; echo done"  # one argument, not split by the shell
    assert "LOCKSTEP_JOB_ID=j-1" in argv and "LOCKSTEP_ATTEMPT=3" in argv
