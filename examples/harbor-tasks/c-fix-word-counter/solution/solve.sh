#!/bin/bash
set -e
cd /app
cat > src/count.c <<'C'
#include <ctype.h>
#include <string.h>
#include "count.h"

void count_stream(FILE *in, struct counts *c)
{
    int ch;
    int in_word = 0;
    long line_len = 0;

    memset(c, 0, sizeof *c);
    while ((ch = getc(in)) != EOF) {
        c->bytes++;
        if (ch == '\n') {
            c->lines++;
            if (line_len > c->max_line)
                c->max_line = line_len;
            line_len = 0;
        } else {
            line_len++;
        }
        if (isspace(ch)) {
            in_word = 0;
        } else if (!in_word) {
            in_word = 1;
            c->words++;
        }
    }
    if (line_len > c->max_line)
        c->max_line = line_len;
}
C
make clean && make
printf 'hello  world\n\tfoo' | ./wcount
