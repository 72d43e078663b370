#include <stdlib.h>
#include <string.h>
#include "strmap.h"

struct entry {
    char *key;
    long value;
    struct entry *next;
};

struct strmap {
    struct entry **buckets;
    size_t nbuckets;
    size_t size;
};

static unsigned long hash(const char *s)
{
    unsigned long h = 5381;
    while (*s)
        h = h * 33 + (unsigned char)*s++;
    return h;
}

static char *copy_key(const char *s)
{
    size_t n = strlen(s);
    char *p = malloc(n);
    if (p)
        memcpy(p, s, n + 1);
    return p;
}

strmap *strmap_new(void)
{
    strmap *m = malloc(sizeof *m);
    if (!m)
        return NULL;
    m->nbuckets = 8;
    m->size = 0;
    m->buckets = calloc(m->nbuckets, sizeof *m->buckets);
    if (!m->buckets) {
        free(m);
        return NULL;
    }
    return m;
}

void strmap_free(strmap *m)
{
    if (!m)
        return;
    for (size_t i = 0; i < m->nbuckets; i++) {
        struct entry *e = m->buckets[i];
        while (e) {
            struct entry *next = e->next;
            free(e);
            e = next;
        }
    }
    free(m->buckets);
    free(m);
}

static int grow(strmap *m)
{
    size_t n = m->nbuckets * 2;
    struct entry **nb = calloc(n, sizeof *nb);
    if (!nb)
        return -1;
    for (size_t i = 0; i < m->nbuckets; i++) {
        struct entry *e = m->buckets[i];
        while (e) {
            struct entry *next = e->next;
            size_t j = hash(e->key) % n;
            e->next = nb[j];
            nb[j] = e;
            e = next;
        }
    }
    free(m->buckets);
    m->buckets = nb;
    m->nbuckets = n;
    return 0;
}

int strmap_put(strmap *m, const char *key, long value)
{
    struct entry **slot = &m->buckets[hash(key) % m->nbuckets];
    for (struct entry *e = *slot; e; e = e->next) {
        if (strcmp(e->key, key) == 0) {
            e->value = value;
            return 0;
        }
    }
    if (m->size + 1 > m->nbuckets * 3 / 4 && grow(m) != 0)
        return -1;
    struct entry *e = malloc(sizeof *e);
    if (!e)
        return -1;
    e->key = copy_key(key);
    if (!e->key) {
        free(e);
        return -1;
    }
    e->value = value;
    e->next = *slot;
    *slot = e;
    m->size++;
    return 1;
}

int strmap_get(const strmap *m, const char *key, long *out)
{
    for (struct entry *e = m->buckets[hash(key) % m->nbuckets]; e; e = e->next) {
        if (strcmp(e->key, key) == 0) {
            if (out)
                *out = e->value;
            return 1;
        }
    }
    return 0;
}

int strmap_remove(strmap *m, const char *key)
{
    struct entry **pp = &m->buckets[hash(key) % m->nbuckets];
    for (struct entry *e = *pp; e; e = e->next) {
        if (strcmp(e->key, key) == 0) {
            *pp = e->next;
            free(e);
            free(e->key);
            m->size--;
            return 1;
        }
        pp = &e->next;
    }
    return 0;
}

size_t strmap_size(const strmap *m)
{
    return m->size;
}

void strmap_foreach(const strmap *m, void (*fn)(const char *, long, void *), void *ctx)
{
    for (size_t i = 0; i < m->nbuckets; i++)
        for (struct entry *e = m->buckets[i]; e; e = e->next)
            fn(e->key, e->value, ctx);
}
