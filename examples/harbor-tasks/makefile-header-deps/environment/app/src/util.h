#ifndef UTIL_H
#define UTIL_H
#include "types.h"
count_t count_vowels(const char *s);
#endif
