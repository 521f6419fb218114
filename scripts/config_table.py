"""Writes the operator guide's table of settings from the Config dataclass.

    python scripts/config_table.py [--check]

The rows of docs/operator-guide.md between its two `settings` markers are `keys_table()` of
krex/core/config.py, where each setting's section, key, type, bounds, default and meaning are
defined once. `--check` writes nothing and exits 1 where the guide differs
(tests/test_config_keys.py checks the same).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from krex.core.config import keys_table

GUIDE = Path(__file__).resolve().parents[1] / "docs" / "operator-guide.md"
BEGIN = "<!-- settings: written by scripts/config_table.py from krex/core/config.py -->\n"
END = "<!-- end of settings -->\n"


def with_table(guide: str) -> str:
    """The guide with its table of settings as the Config dataclass has it."""
    head, begin, rest = guide.partition(BEGIN)
    _, end, tail = rest.partition(END)
    if not (begin and end):
        raise SystemExit(f"{GUIDE}: no {BEGIN.strip()} ... {END.strip()} markers")
    return head + BEGIN + keys_table() + END + tail


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 where the guide differs")
    args = ap.parse_args()
    guide = GUIDE.read_text()
    wanted = with_table(guide)
    if args.check:
        sys.exit(0 if wanted == guide else 1)
    GUIDE.write_text(wanted)


if __name__ == "__main__":
    main()
