#!/usr/bin/env bash
# The C sources' format (.clang-format at the top of the tree).
#   tests/tools/format.sh --check    lists the files clang-format would change; exit 1 if any (77: no clang-format)
#   tests/tools/format.sh --fix      rewrites them
# The files: every tracked .c and .h, the fuzz corpora aside.
set -u
cd "$(dirname "$0")/../.." || exit 2
CF=${CLANG_FORMAT:-clang-format}
command -v "$CF" >/dev/null || { echo "format: $CF not found (apt-get install clang-format)"; exit 77; }
mapfile -t files < <(git ls-files '*.c' '*.h' 2>/dev/null | grep -v '^tests/fuzz/corpus/')
[ ${#files[@]} -gt 0 ] || { echo "format: no tracked C files (not a git checkout?)"; exit 77; }
case "${1:-}" in
  --fix) "$CF" -i "${files[@]}" ;;
  --check)
    bad=0
    for f in "${files[@]}"; do
      if ! "$CF" --dry-run -Werror "$f" >/dev/null 2>&1; then echo "not formatted: $f"; bad=$((bad + 1)); fi
    done
    echo "format: ${#files[@]} files, $bad not as .clang-format says (tests/tools/format.sh --fix)"
    [ "$bad" -eq 0 ] ;;
  *) echo "usage: $0 --check|--fix" >&2; exit 2 ;;
esac
