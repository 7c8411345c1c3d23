"""A 422 with several field errors: the message names every field, the first too (issue 29).

Before, the message dropped the first field's name (the body's "field" carried it), so a reader saw a reason
with no field in front of it followed by "other: reason" pairs.
"""

from __future__ import annotations

from broker.errors import SpecError, error_from_api
from tests.api.conftest import Api, spec


def test_every_field_in_a_422_names_itself(api: Api) -> None:
    body = spec("two-wrongs", gpus=0, colour="blue")
    with api.client(api.alice) as alice:
        r = alice.post("/v1/quotes", json=body)
    assert r.status_code == 422, r.text
    err = r.json()["error"]
    parts = err["message"].split("; ")
    assert len(parts) >= 2, err
    fields = [p.partition(": ")[0] for p in parts]
    assert fields[0] == err["field"] and {"gpus", "colour"} <= set(fields), err
    # The client turns it back into the same one line, each field named once.
    back = error_from_api(err["code"], err["message"], err["field"])
    assert isinstance(back, SpecError) and str(back) == err["message"]


def test_a_single_error_keeps_the_reason_alone() -> None:
    exc = SpecError("gpus", "must be positive")
    assert exc.public_message == "must be positive" and str(exc) == "gpus: must be positive"
