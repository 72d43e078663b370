#ifndef STRMAP_H
#define STRMAP_H
#include <stddef.h>

/* A hash map from NUL-terminated strings to long values. The map owns copies of its keys. */
typedef struct strmap strmap;

strmap *strmap_new(void);                  /* NULL if out of memory */
void strmap_free(strmap *m);               /* frees everything; strmap_free(NULL) does nothing */

/* Insert or update: 1 if the key was new, 0 if its value was replaced, -1 if out of memory. */
int strmap_put(strmap *m, const char *key, long value);

/* 1 and *out = value if the key is present, else 0 (out may be NULL). */
int strmap_get(const strmap *m, const char *key, long *out);

/* 1 if the key was present and is now removed, else 0. */
int strmap_remove(strmap *m, const char *key);

size_t strmap_size(const strmap *m);

/* Calls fn(key, value, ctx) once for every entry, in no particular order. fn must not modify the map. */
void strmap_foreach(const strmap *m, void (*fn)(const char *key, long value, void *ctx), void *ctx);

#endif
