#!/usr/bin/env bash
# The C++ and CUDA sources formatted by clang-format-14 to .clang-format (120 columns).
#
#   scripts/format.sh           formats them in place (make format)
#   scripts/format.sh --check   changes nothing; exits 1 naming every file clang-format would change
#
# The sources are the repository's tracked *.cc, *.h and *.cu files (every such file under the
# source folders where the tree is not a git checkout).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
check=0
case "${1:-}" in
  --check) check=1 ;;
  "") ;;
  *) echo "usage: scripts/format.sh [--check]" >&2; exit 2 ;;
esac
tool="$(command -v clang-format-14 || true)"
[ -n "$tool" ] || { echo "format: needs clang-format-14 (Debian's clang-format-14; make deps installs it)" >&2; exit 1; }

if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  mapfile -t files < <(git ls-files '*.cc' '*.h' '*.cu')
else
  mapfile -t files < <(find api bench cli common controller fuzz testing tests worker \
                            -name '*.cc' -o -name '*.h' -o -name '*.cu' | sort)
fi
((${#files[@]})) || { echo "format: no C++ sources found under $root" >&2; exit 1; }

if ((check == 0)); then
  "$tool" -i "${files[@]}"
  echo "format: ${#files[@]} files formatted"
  exit 0
fi
# One run over every file first; only where it fails, a run a file to name them.
if "$tool" --dry-run --Werror "${files[@]}" >/dev/null 2>&1; then
  echo "format: ${#files[@]} files formatted as .clang-format says"
  exit 0
fi
bad=()
for f in "${files[@]}"; do
  "$tool" --dry-run --Werror "$f" >/dev/null 2>&1 || bad+=("$f")
done
if ((${#bad[@]})); then
  echo "format: ${#bad[@]} of ${#files[@]} files are not formatted as .clang-format says (run scripts/format.sh or make format):" >&2
  printf '  %s\n' "${bad[@]}" >&2
  for f in "${bad[@]:0:3}"; do "$tool" "$f" | diff -u "$f" - | head -20 >&2 || true; done
  exit 1
fi
echo "format: ${#files[@]} files formatted as .clang-format says"
