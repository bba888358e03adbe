#!/usr/bin/env python3
"""Lists public declarations in Sources/ that have no `///` doc comment; exits 1 if there is any.

A declaration counts as public when its line carries `public` or `open`, or when it is a `case` of a public
enum. Attributes (`@inlinable`, `@discardableResult`, …) between the comment and the declaration are fine.
Usage: Tools/check-docs.py [ROOT]
"""

import pathlib
import re
import sys

DECLARATION = re.compile(
    r"^\s*(?:@\w+(?:\([^)]*\))?\s+)*(?:(?:public|open)(?:\(set\))?\s+|(?:nonisolated|static|final|override|"
    r"mutating|private\(set\)|fileprivate\(set\)|internal\(set\)|package\(set\)|convenience|required|lazy|"
    r"weak|unowned|indirect)\s+)*(?:public|open)\s"
)
PUBLIC_ENUM = re.compile(r"^(\s*)(?:@\w+\s+)*(?:public|open)\s+(?:indirect\s+)?enum\s")
CASE = re.compile(r"^\s*(?:indirect\s+)?case\s+\w")


def documented(lines: list[str], index: int) -> bool:
    """Whether the declaration at `index` is preceded by a doc comment (skipping attributes)."""
    i = index - 1
    while i >= 0:
        text = lines[i].strip()
        if text.startswith("@") or text.startswith("#if") or text.startswith("#endif"):
            i -= 1
            continue
        return text.startswith("///") or text.endswith("*/")
    return False


def check(path: pathlib.Path) -> list[str]:
    lines = path.read_text(encoding="utf-8").splitlines()
    missing = []
    enum_indent: list[str] = []  # indents of the public enums we are inside of
    for index, line in enumerate(lines):
        stripped = line.strip()
        if enum_indent and stripped == "}" and line[: len(line) - len(line.lstrip())] == enum_indent[-1]:
            enum_indent.pop()
        match = PUBLIC_ENUM.match(line)
        if match:
            enum_indent.append(match.group(1))
        is_public = DECLARATION.match(line) is not None
        # A case directly inside a public enum (one level deeper than the enum's own line).
        if enum_indent and CASE.match(line):
            depth = len(line) - len(line.lstrip())
            is_public = is_public or depth == len(enum_indent[-1]) + 4
        if not is_public or stripped.startswith("//"):
            continue
        # Extensions are not declarations of their own.
        if re.match(r"^\s*(?:public\s+)?extension\s", line):
            continue
        if not documented(lines, index):
            missing.append(f"{path}:{index + 1}: {stripped[:100]}")
    return missing


def main() -> int:
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".")
    missing = []
    for path in sorted((root / "Sources").rglob("*.swift")):
        missing += check(path)
    for entry in missing:
        print(entry)
    if missing:
        print(f"{len(missing)} public declarations have no /// doc comment", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
