#!/usr/bin/env python3
"""Lists public declarations in Sources/ that have no `///` doc comment; exits 1 if there is any.

A declaration counts as public when its line carries `public` or `open`; when it is a `case` of a public enum; when
it is a requirement of a public protocol (its functions, properties, initializers, subscripts, associated types);
or when it is a member of a `public extension` without an access modifier of its own. Stored properties,
typealiases and initializers count like any other declaration. Attributes (`@inlinable`, `@discardableResult`, …)
between the comment and the declaration are fine.
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
# A public type or extension whose members count as public without saying so: group 2 is its kind.
PUBLIC_CONTAINER = re.compile(
    r"^(\s*)(?:@\w+(?:\([^)]*\))?\s+)*(?:public|open)\s+(?:indirect\s+)?(enum|protocol|extension)\s"
)
CASE = re.compile(r"^\s*(?:indirect\s+)?case\s+\w")
# A member declaration (after attributes and modifiers), for protocol requirements and public extension members.
MEMBER = re.compile(
    r"^\s*(?:@\w+(?:\([^)]*\))?\s+)*(?:(?:nonisolated|static|class|final|mutating|nonmutating|override|"
    r"convenience|required|lazy|indirect)\s+)*(?:func|var|let|init|subscript|associatedtype|typealias|struct|"
    r"enum|class|actor|protocol)\b"
)
RESTRICTED = re.compile(r"^\s*(?:@\w+(?:\([^)]*\))?\s+)*(?:\w+\s+)*(?:private|fileprivate|internal|package)\b")


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
    containers: list[tuple[str, str]] = []  # (indent, kind) of the public enums, protocols, extensions we are in
    for index, line in enumerate(lines):
        stripped = line.strip()
        indent = line[: len(line) - len(line.lstrip())]
        if containers and stripped.startswith("}") and indent == containers[-1][0]:
            containers.pop()
        is_public = DECLARATION.match(line) is not None
        # A direct member of a public container: one level deeper than the container's own line.
        if containers and len(indent) == len(containers[-1][0]) + 4 and not stripped.startswith("//"):
            kind = containers[-1][1]
            if kind == "enum" and CASE.match(line):
                is_public = True
            elif kind == "protocol" and MEMBER.match(line):
                is_public = True
            elif kind == "extension" and MEMBER.match(line) and not RESTRICTED.match(line):
                is_public = True
        match = PUBLIC_CONTAINER.match(line)
        if match and not stripped.endswith("}"):
            containers.append((match.group(1), match.group(2)))
        if not is_public or stripped.startswith("//"):
            continue
        # Extensions are not declarations of their own.
        if re.match(r"^\s*(?:@\w+\s+)*(?:public\s+)?extension\s", line):
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
    print(f"{len(missing)} public declarations have no /// doc comment", file=sys.stderr if missing else sys.stdout)
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
