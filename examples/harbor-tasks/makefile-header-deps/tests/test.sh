#!/bin/bash
# Edits files in a scratch copy of /app and checks which files make rebuilds and what ./app prints.
mkdir -p /logs/verifier
echo 0 > /logs/verifier/reward.txt
W=$(mktemp -d)/proj
fail() { echo "FAIL: $*"; exit 0; }
cp -a /app "$W" || fail "cannot copy /app"
cd "$W" || fail "no copy"
rm -rf build app
M() { timeout 60 make --no-print-directory "$@" > "$W.make.log" 2>&1; local rc=$?; cat "$W.make.log"; return $rc; }
NOW=$(date +%s)
STEP=0
# Make every file look old (products newer than sources), so the next edit is strictly newer.
age() {
    STEP=$((STEP + 1000))
    local base=$((NOW - 100000 + STEP))
    find "$W" -path "$W/build" -prune -o -type f ! -name app -exec touch -h -d "@$base" {} +
    find "$W/build" "$W/app" -exec touch -h -d "@$((base + 500))" {} + 2>/dev/null
}
edit() { # edit FILE SED-EXPR: change a source file and give it a time after the products
    sed -i "$2" "$1" || fail "cannot edit $1"
    touch -d "@$((NOW - 100000 + STEP + 800))" "$1"
}
rebuilt() { # space-separated list of build/*.o and app newer than the aged products
    local f out=""
    for f in build/*.o app; do
        [ -e "$f" ] && [ "$(stat -c %Y "$f")" -gt $((NOW - 100000 + STEP + 500)) ] && out="$out ${f}"
    done
    echo "${out# }"
}
expect_rebuilt() { # expect_rebuilt "what" "list"
    local got; got=$(rebuilt)
    [ "$got" = "$2" ] || fail "$1: rebuilt [$got], expected [$2]"
}
run() { timeout 5 ./app 2>&1; }

M || fail "make failed on a clean tree"
[ -x app ] && [ -f build/main.o ] && [ -f build/util.o ] || fail "make did not produce app, build/main.o and build/util.o"
[ "$(run)" = $'Hello, world! (v1.0)\nvowels: 2' ] || fail "unexpected output: $(run)"

age; M || fail "second make failed"
expect_rebuilt "make right after a build" ""

age; edit src/config.h 's/"Hello"/"Howdy"/'; M || fail "make after editing config.h failed"
expect_rebuilt "after editing src/config.h" "build/main.o app"
[ "$(run)" = $'Howdy, world! (v1.0)\nvowels: 1' ] || fail "config.h change not picked up: $(run)"

age; edit src/types.h 's/typedef long count_t;/typedef long long count_t;/; s/"%ld"/"%lld"/'
M || fail "make after editing types.h failed"
expect_rebuilt "after editing src/types.h (included through util.h)" "build/main.o build/util.o app"

age; edit src/util.c 's/#include "util.h"/#include "util.h"\n#include "config.h"/'
M || fail "make after editing util.c failed"
expect_rebuilt "after editing src/util.c" "build/util.o app"
age; edit src/config.h 's/"1.0"/"2.0"/'; M || fail "make after editing config.h failed"
expect_rebuilt "after editing src/config.h, now also included by util.c" "build/main.o build/util.o app"
[ "$(run)" = $'Howdy, world! (v2.0)\nvowels: 1' ] || fail "unexpected output: $(run)"

age; edit src/util.c '/#include "legacy.h"/d'; rm -f src/legacy.h
M || fail "make failed after removing legacy.h and its #include"
expect_rebuilt "after dropping legacy.h" "build/util.o app"

age; printf 'int extra_answer(void) { return 42; }\n' > src/extra.c; touch -d "@$((NOW - 100000 + STEP + 800))" src/extra.c
M || fail "make failed after adding src/extra.c"
expect_rebuilt "after adding src/extra.c" "build/extra.o app"

age; M || fail "final make failed"
expect_rebuilt "final make with nothing changed" ""

M clean || fail "make clean failed"
[ ! -e app ] && [ ! -e build ] || fail "make clean left app or build/"
echo 1 > /logs/verifier/reward.txt
echo "reward: 1"
