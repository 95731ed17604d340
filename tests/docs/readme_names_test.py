#!/usr/bin/env python3
"""Everything the README names in code exists: each `make` target in the Makefile, each repository
path in the tree, each `tessera` subcommand in the CLI's usage.

  readme_names_test.py --root REPO --tessera build/bin/tessera [--makefile FILE]

Reads the README's code spans and blocks only (prose may say "make" in English). Prints what it
checked; exits 1 naming every name that does not exist.
"""
import argparse
import os
import re
import subprocess
import sys

TOP = ("api", "bench", "charts", "cli", "cmake", "common", "controller", "crds", "docs", "examples", "fuzz", "images",
       "proto", "scripts", "testing", "tests", "worker", ".ci")


def code_of(readme):
    """The README's fenced blocks and inline code spans, as one list of strings."""
    blocks = re.findall(r"^```[^\n]*\n(.*?)^```", readme, flags=re.S | re.M)
    prose = re.sub(r"^```[^\n]*\n.*?^```", "", readme, flags=re.S | re.M)
    spans = re.findall(r"`([^`\n]+)`", prose)
    # indented blocks (four spaces) are code too
    indented = re.findall(r"^    (\S.*)$", prose, flags=re.M)
    return blocks + spans + indented


def make_targets(makefile):
    with open(makefile) as f:
        return set(re.findall(r"^([A-Za-z][\w-]*)\s*:(?!=)", f.read(), flags=re.M))


def subcommands(tessera):
    usage = subprocess.run([tessera, "--help"], capture_output=True, text=True, timeout=60)
    return set(re.findall(r"^\s*tessera ([a-z]+)", usage.stdout + usage.stderr, flags=re.M))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--root", required=True)
    p.add_argument("--tessera", required=True)
    p.add_argument("--makefile")
    a = p.parse_args()
    with open(os.path.join(a.root, "README.md")) as f:
        readme = f.read()
    code = code_of(readme)
    targets = make_targets(a.makefile or os.path.join(a.root, "Makefile"))
    commands = subcommands(a.tessera)
    if not targets or not commands:
        sys.exit("readme_names: found no make targets or no tessera subcommands to check against")
    named_targets, named_commands, named_paths = set(), set(), set()
    for c in code:
        named_targets |= set(re.findall(r"(?<![\w-])make ([a-z][\w-]*)", c))
        named_commands |= set(re.findall(r"(?<![\w/-])tessera ([a-z]+)(?=[\s`]|$)", c))
        for path in re.findall(r"(?<![\w./-])((?:%s)/[\w./-]*)" % "|".join(re.escape(t) for t in TOP), c):
            path = path.rstrip(".,")
            if re.search(r"[A-Z]{3,}", path):  # a placeholder (DIR, JOB.yaml)
                continue
            named_paths.add(path)
    # Markdown links into the tree
    named_paths |= {l for l in re.findall(r"\]\(([^)#:]+)\)", readme) if l.split("/")[0] in TOP}
    missing = [f"`make {t}`: no such target in the Makefile" for t in sorted(named_targets - targets)]
    missing += [f"`tessera {c}`: no such subcommand in `tessera --help`" for c in sorted(named_commands - commands)]
    missing += [f"{p}: no such file or directory" for p in sorted(named_paths)
                if not os.path.exists(os.path.join(a.root, p))]
    print(f"readme_names: {len(named_targets)} make targets, {len(named_commands)} tessera subcommands, "
          f"{len(named_paths)} repository paths named in README.md")
    for m in missing:
        print(f"README.md names {m}", file=sys.stderr)
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
