"""``atom-operator``: run the operator (:func:`atom_operator.main.main`); its settings come from the environment
(:mod:`atom_operator.config`)."""

from __future__ import annotations

import argparse
import sys

from atom_operator import __version__


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="atom-operator", description="The AtomDeployment operator.")
    parser.add_argument("--version", action="version", version=f"atom-operator {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log at DEBUG")
    args = parser.parse_args(argv)
    from atom_operator.main import main as run  # the client library is slow to import; --version need not wait

    return run(verbose=args.verbose)


if __name__ == "__main__":
    sys.exit(main())
