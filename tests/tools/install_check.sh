#!/usr/bin/env bash
# Installs a build into a scratch prefix and builds a small consumer against it twice: with CMake's
# find_package(uattn) and with pkg-config. Proves the installed header, libraries and package files work.
set -euo pipefail
build=${1:-build}
here=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cmake --install "$here/$build" --prefix "$work/prefix" >/dev/null

mkdir -p "$work/consumer"
cat > "$work/consumer/main.c" <<'C'
#include <stdio.h>
#include <uattn.h>
#include <uattn_tuning.h>
#include <uattn_vllm.h>
int main(void) {
  uattn_plan_config c = uattn_plan_config_default(16, 64, 4, 64, 256);
  uattn_plan *p;
  if (uattn_plan_create(&c, &p) != UATTN_OK) return 1;
  const int nc[] = {0}, ns[] = {5}, np[] = {5}, table[] = {3};
  uattn_step s = {.num_reqs = 1, .num_computed = nc, .num_scheduled = ns, .num_prompt = np,
                  .block_table = table, .block_table_stride = 1};
  uattn_plan_info in;
  int ok = uattn_plan_step(p, &s) == UATTN_OK && uattn_plan_get_info(p, &in) == UATTN_OK && in.num_tokens == 5 &&
           in.slot_mapping[4] == 3 * 16 + 4;
  uattn_plan_destroy(p);
  printf("consumer: uattn %s %s\n", uattn_version(), ok ? "works" : "FAILED");
  return ok ? 0 : 1;
}
C
cat > "$work/consumer/CMakeLists.txt" <<'CM'
cmake_minimum_required(VERSION 3.18)
project(consumer C)
find_package(uattn REQUIRED)
add_executable(consumer main.c)
target_link_libraries(consumer PRIVATE uattn::uattn)
CM
cmake -S "$work/consumer" -B "$work/consumer/build" -DCMAKE_PREFIX_PATH="$work/prefix" >/dev/null
cmake --build "$work/consumer/build" >/dev/null
LD_LIBRARY_PATH="$work/prefix/lib" "$work/consumer/build/consumer"

libdir=$(ls -d "$work"/prefix/lib*/pkgconfig | head -n1)
export PKG_CONFIG_PATH="$libdir"
cc "$work/consumer/main.c" -o "$work/consumer/pc" $(pkg-config --cflags --libs uattn)
LD_LIBRARY_PATH="$(dirname "$libdir")" "$work/consumer/pc"
cc "$work/consumer/main.c" -o "$work/consumer/pc-static" $(pkg-config --cflags uattn) "$(dirname "$libdir")/libuattn.a" \
  $(pkg-config --static --libs-only-l uattn | sed 's/-luattn//')
"$work/consumer/pc-static"
echo "install check: find_package, pkg-config (shared and static) all link and run"
