"""``atom-operator``: run the operator (``kopf run`` on :mod:`atom_operator.main`) across all namespaces."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    from kopf.cli import main as kopf_main

    args = ["run", "--all-namespaces", "--standalone", "-m", "atom_operator.main", *(argv or sys.argv[1:])]
    try:
        kopf_main.main(args=args, prog_name="atom-operator", standalone_mode=False)
    except SystemExit as e:  # click exits with the operator's own status
        return int(e.code or 0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
