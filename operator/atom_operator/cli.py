"""``atom-operator``: run the operator (``kopf run`` on :mod:`atom_operator.main`) across all namespaces.

``atom-operator --version`` prints the version; any other arguments go to ``kopf run``.
"""

from __future__ import annotations

import sys

from atom_operator import __version__


def main(argv: list[str] | None = None) -> int:
    extra = list(sys.argv[1:] if argv is None else argv)
    if extra[:1] == ["--version"]:
        print(f"atom-operator {__version__}")
        return 0
    from kopf.cli import main as kopf_main  # kopf is slow to import; --version should not pay for it

    args = ["run", "--all-namespaces", "--standalone", "-m", "atom_operator.main", *extra]
    try:
        kopf_main.main(args=args, prog_name="atom-operator", standalone_mode=False)
    except SystemExit as e:  # click exits with the operator's own status
        return int(e.code or 0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
