#!/usr/bin/python3
"""Every relative link of the project's Markdown leads somewhere.

    test/check-links.py TOP

Checks README.md, CHANGELOG.md, CONTRIBUTING.md, bench/README.md, docs/*.md, the
clients' Markdown (clients/*/README.md, clients/*/docs/*.md) and the packages'
READMEs (proxy/, console/, adapters/ and each adapter's): each relative
link (outside code) names a file that exists and, with a #fragment, a heading
of that file whose GitHub anchor it is.  Prints one TAP line per file and exits
non-zero when a link is broken.
"""

import glob
import os
import re
import sys


def outside_code(path):
    """The file's lines outside fenced code blocks, without inline code."""
    fence = False
    for line in open(path, encoding="utf-8"):
        if line.lstrip().startswith("```"):
            fence = not fence
            continue
        if not fence:
            yield re.sub(r"`[^`]*`", "", line)


def anchors(path):
    """GitHub's anchors of a Markdown file's headings."""
    found, seen = set(), {}
    for line in outside_code(path):
        m = re.match(r"^(#{1,6})\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        slug = re.sub(r"[^\w\- ]", "", m.group(2).strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        found.add(slug if n == 0 else f"{slug}-{n}")
    return found


def broken_links(path):
    for target in re.findall(r"\]\(([^)\s]+)\)", "".join(outside_code(path))):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        name, _, fragment = target.partition("#")
        full = os.path.normpath(os.path.join(os.path.dirname(path), name)) if name else path
        if not os.path.exists(full):
            yield f"{target}: no file {os.path.relpath(full)}"
        elif fragment and (not full.endswith(".md") or fragment not in anchors(full)):
            yield f"{target}: no heading #{fragment} in {os.path.relpath(full)}"


def main():
    top = sys.argv[1] if len(sys.argv) > 1 else "."
    os.chdir(top)
    files = [f for f in ("README.md", "CHANGELOG.md", "CONTRIBUTING.md", "bench/README.md",
                         "proxy/README.md", "console/README.md", "adapters/README.md")
             if os.path.exists(f)]
    files += sorted(glob.glob("docs/*.md") + glob.glob("clients/*/README.md")
                    + glob.glob("clients/*/docs/*.md") + glob.glob("adapters/*/README.md"))
    failed = 0
    for n, path in enumerate(files, 1):
        broken = list(broken_links(path))
        print(f"{'not ok' if broken else 'ok'} {n} - the relative links of {path} resolve")
        for problem in broken:
            print(f"#   {problem}")
        failed += bool(broken)
    print(f"1..{len(files)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
