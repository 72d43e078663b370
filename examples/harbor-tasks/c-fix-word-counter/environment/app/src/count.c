#include <ctype.h>
#include <string.h>
#include "count.h"

void count_stream(FILE *in, struct counts *c)
{
    char buf[256];
    memset(c, 0, sizeof *c);
    while (fgets(buf, sizeof buf, in) != NULL) {
        size_t len = strlen(buf);
        c->bytes += len;
        if (len > 0 && buf[len - 1] == '\n') {
            c->lines++;
            len--;
        }
        if ((long)len > c->max_line)
            c->max_line = len;
        for (size_t i = 0; i < len; i++) {
            if (isspace((unsigned char)buf[i]))
                c->words++;
        }
        if (len > 0)
            c->words++;
    }
}
