"""The job's table of the zoo's options (read without importing the zoo, or torch) is the zoo's."""

from __future__ import annotations

from autopar.job.zoo_options import ZOO_OPTIONS
from autopar.planner.zoo import list_models, model_options


def test_the_table_is_the_zoo():
    assert ZOO_OPTIONS == {name: model_options(name) for name in list_models()}
    assert list(ZOO_OPTIONS) == list_models()


def test_the_operator_starts_without_torch():
    """`autopar operator run`'s imports (the handlers, reconcile, the job's checks) load no torch:
    it would be most of the operator's memory."""
    import subprocess
    import sys
    code = ("import sys; import autopar.cli, autopar.operator.handlers, autopar.operator.reconcile; "
            "from autopar.job.pipeline import checked_model_options; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
