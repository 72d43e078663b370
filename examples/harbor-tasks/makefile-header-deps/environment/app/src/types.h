#ifndef TYPES_H
#define TYPES_H
typedef long count_t;
#define COUNT_FMT "%ld"
#endif
