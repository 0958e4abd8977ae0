"""``python -m atom_localcluster.operator_main [MODULE ...]``: the operator (``atom-operator``), after importing each
MODULE into its process: how a test installs a hook (tests/operator/failpoint.py) that the operator knows nothing of."""

from __future__ import annotations

import importlib
import sys

from atom_operator.cli import main

if __name__ == "__main__":
    for module in sys.argv[1:]:
        importlib.import_module(module)
    sys.exit(main([]))
