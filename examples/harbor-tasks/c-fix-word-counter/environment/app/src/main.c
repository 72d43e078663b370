#include <stdio.h>
#include <stdlib.h>
#include "count.h"

int main(int argc, char **argv)
{
    FILE *in = stdin;
    struct counts c;

    if (argc > 2) {
        fprintf(stderr, "usage: %s [FILE]\n", argv[0]);
        return 2;
    }
    if (argc == 2) {
        in = fopen(argv[1], "rb");
        if (in == NULL) {
            perror(argv[1]);
            return 1;
        }
    }
    count_stream(in, &c);
    printf("%ld %ld %ld %ld\n", c.lines, c.words, c.bytes, c.max_line);
    if (in != stdin)
        fclose(in);
    return 0;
}
