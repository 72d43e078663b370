#ifndef COUNT_H
#define COUNT_H
#include <stdio.h>

struct counts {
    long lines;     /* number of '\n' bytes */
    long words;     /* maximal runs of non-whitespace bytes */
    long bytes;     /* total bytes */
    long max_line;  /* longest line in bytes, without its '\n' */
};

/* Count everything in the stream. */
void count_stream(FILE *in, struct counts *c);

#endif
