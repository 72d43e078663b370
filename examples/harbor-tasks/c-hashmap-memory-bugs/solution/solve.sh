#!/bin/bash
set -e
cd /app
python3 - <<'PY'
import re
s = open("strmap.c").read()
# 1. room for the terminating NUL
s = s.replace("    char *p = malloc(n);\n", "    char *p = malloc(n + 1);\n")
# 2. keys were leaked by strmap_free
s = s.replace("            struct entry *next = e->next;\n            free(e);\n            e = next;",
              "            struct entry *next = e->next;\n            free(e->key);\n            free(e);\n            e = next;")
# 3. use after free in remove
s = s.replace("            free(e);\n            free(e->key);", "            free(e->key);\n            free(e);")
# 4. slot pointed into the bucket array that grow() frees: recompute it after growing
s = s.replace("    if (m->size + 1 > m->nbuckets * 3 / 4 && grow(m) != 0)\n        return -1;\n",
              "    if (m->size + 1 > m->nbuckets * 3 / 4) {\n        if (grow(m) != 0)\n            return -1;\n"
              "        slot = &m->buckets[hash(key) % m->nbuckets];\n    }\n")
open("strmap.c", "w").write(s)

w = open("wordfreq.c").read()
# 5. words of any length: grow the buffer instead of overflowing word[32]
w = w.replace("    char word[32];\n    size_t len = 0;\n", "    size_t cap = 32, len = 0;\n    char *word = malloc(cap);\n")
w = w.replace("    if (!m)\n        return 1;\n    while", "    if (!m || !word)\n        return 1;\n    while")
w = w.replace("        if (isalpha(c)) {\n            word[len++] = (char)tolower(c);",
              "        if (isalpha(c)) {\n            if (len + 1 >= cap) {\n                char *bigger = realloc(word, cap *= 2);\n"
              "                if (!bigger)\n                    return 1;\n                word = bigger;\n            }\n"
              "            word[len++] = (char)tolower(c);")
w = w.replace("    free(col.items);\n    strmap_free(m);", "    free(col.items);\n    free(word);\n    strmap_free(m);")
open("wordfreq.c", "w").write(w)
PY
make -s clean
make -s wordfreq-asan
printf 'the cat and the hat\nThe end %s\n' "$(head -c 3000 /dev/zero | tr '\0' x)" | ./wordfreq-asan 3
make -s clean
