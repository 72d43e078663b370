#include <stdio.h>
#include "config.h"
#include "util.h"

int main(void)
{
    printf("%s, world! (v%s)\n", GREETING, VERSION);
    printf("vowels: " COUNT_FMT "\n", count_vowels(GREETING));
    return 0;
}
