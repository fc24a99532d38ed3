"""``schedext`` with one guard taken out, for the soak's planted-fault test only.

Run as ``python -m loadtests.soak.planted serve ...`` in place of ``python -m app.cli serve
...``. schedext then reads no pod's ``schedext.io/gpu-ids``: each bound pod holds its GPUs
anonymously, so schedext no longer knows which indices are taken and gives them again. The
soak's checker must see that as ``gpu-twice`` (tests/e2e/test_soak.py); nothing else may
import this module.
"""

from __future__ import annotations

import sys

from app import cli
from extender import requests


def _no_record(value: str | None) -> tuple[int, ...] | None:
    del value  # the record is what this replica does not read
    return None


if __name__ == "__main__":
    requests.gpu_ids_annotation = _no_record
    sys.exit(cli.main())
