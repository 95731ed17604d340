#!/usr/bin/env python3
"""The longest C++ functions under some folders, from universal-ctags' line ranges.

  scripts/longest_functions.py [--top N] [--max LINES] [--cuda] DIR...

Lists the N longest function definitions (lines, file:line, name), longest first. With --max, exits
1 naming every function longer than LINES. --cuda reads .cu files as C++ as well (ctags has no CUDA
parser). Lambdas count towards the function that holds them.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys


def functions(dirs, cuda):
    ctags = shutil.which("ctags")
    if not ctags:
        sys.exit("longest_functions: needs universal-ctags (Debian's universal-ctags package)")
    cmd = [ctags, "--output-format=json", "--fields=+ne", "--kinds-C++=f", "--languages=C++", "-R", "-f", "-"]
    if cuda:
        cmd.append("--langmap=C++:+.cu.cuh")
    out = subprocess.run(cmd + dirs, check=True, capture_output=True, text=True).stdout
    for line in out.splitlines():
        tag = json.loads(line)
        if tag.get("_type") != "tag" or "end" not in tag:
            continue
        scope = tag.get("scope", "")
        name = tag["name"]
        # anonymous namespaces and tessera:: say nothing about the function
        parts = [p for p in scope.split("::") if p and p != "tessera" and not p.startswith("__anon")]
        yield tag["end"] - tag["line"] + 1, f'{tag["path"]}:{tag["line"]}', "::".join(parts + [name])


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("dirs", nargs="+")
    p.add_argument("--top", type=int, default=10)
    p.add_argument("--max", type=int, default=0, help="fail on any function longer than this")
    p.add_argument("--cuda", action="store_true")
    a = p.parse_args()
    for d in a.dirs:
        if not os.path.isdir(d):
            sys.exit(f"longest_functions: '{d}' is not a directory")
    found = sorted(functions(a.dirs, a.cuda), key=lambda f: (-f[0], f[1]))
    for n, where, name in found[: a.top]:
        print(f"{n:5d}  {where:48s} {name}")
    if a.max:
        over = [f for f in found if f[0] > a.max]
        for n, where, name in over:
            print(f"longest_functions: {name} ({where}) has {n} lines, over {a.max}", file=sys.stderr)
        return 1 if over else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
