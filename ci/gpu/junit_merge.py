"""Merge pytest junit files into one: `python ci/gpu/junit_merge.py OUT IN [IN ...]`."""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print("usage: junit_merge.py OUT IN [IN ...]", file=sys.stderr)
        return 2
    out, inputs = argv[0], argv[1:]
    merged = ET.Element("testsuite", name="pytest")
    for path in inputs:
        try:
            root = ET.parse(path).getroot()
        except (OSError, ET.ParseError) as error:
            print(f"junit_merge: skipping {path}: {error}", file=sys.stderr)
            continue
        merged.extend(root.iter("testcase"))
    tree = ET.ElementTree(ET.Element("testsuites"))
    tree.getroot().append(merged)
    tree.write(out, encoding="utf-8", xml_declaration=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
