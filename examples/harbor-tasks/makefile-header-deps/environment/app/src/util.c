#include <string.h>
#include "util.h"
#include "legacy.h"

count_t count_vowels(const char *s)
{
    count_t n = 0;
    for (; *s; s++)
        if (strchr("aeiouAEIOU", *s))
            n++;
    return n;
}
