/* Hidden API test for strmap.c: compares against a trivial array model. Prints DRIVER OK. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "strmap.h"

#define N 3000
static int failures;
#define CHECK(cond, ...) do { if (!(cond)) { failures++; if (failures < 10) { printf("FAIL line %d: ", __LINE__); printf(__VA_ARGS__); printf("\n"); } } } while (0)

static char keys[N][24];
static long model[N];
static int present[N];

struct seen { long sum; size_t count; int dup; int *hits; };

static void visit(const char *key, long value, void *ctx)
{
    struct seen *s = ctx;
    int i;
    s->sum += value;
    s->count++;
    if (sscanf(key, "key-%d", &i) == 1 && i >= 0 && i < N) {
        if (s->hits[i]++)
            s->dup = 1;
        if (!present[i] || model[i] != value)
            s->dup = 1;
    }
}

int main(void)
{
    strmap *m = strmap_new();
    long v;
    size_t size = 0;
    CHECK(m != NULL, "strmap_new");
    CHECK(strmap_size(m) == 0, "empty size");
    CHECK(strmap_get(m, "missing", &v) == 0, "get on empty");
    CHECK(strmap_remove(m, "missing") == 0, "remove on empty");

    for (int i = 0; i < N; i++) {
        snprintf(keys[i], sizeof keys[i], "key-%d", i);
        char tmp[24];
        strcpy(tmp, keys[i]);                   /* the map must copy the key */
        CHECK(strmap_put(m, tmp, i * 3L) == 1, "put new %d", i);
        memset(tmp, 'X', sizeof tmp - 1);
        model[i] = i * 3L;
        present[i] = 1;
        size++;
        CHECK(strmap_size(m) == size, "size after put %d", i);
    }
    for (int i = 0; i < N; i += 2) {
        CHECK(strmap_put(m, keys[i], -i) == 0, "update %d", i);
        model[i] = -i;
    }
    CHECK(strmap_size(m) == size, "size after updates");
    for (int i = 0; i < N; i++) {
        v = 12345;
        CHECK(strmap_get(m, keys[i], &v) == 1 && v == model[i], "get %d -> %ld want %ld", i, v, model[i]);
    }
    CHECK(strmap_get(m, "key-", NULL) == 0, "get prefix");
    CHECK(strmap_get(m, keys[7], NULL) == 1, "get with NULL out");

    for (int i = 0; i < N; i += 3) {
        CHECK(strmap_remove(m, keys[i]) == 1, "remove %d", i);
        CHECK(strmap_remove(m, keys[i]) == 0, "remove again %d", i);
        present[i] = 0;
        size--;
    }
    CHECK(strmap_size(m) == size, "size after removes");
    for (int i = 0; i < N; i++) {
        int got = strmap_get(m, keys[i], &v);
        CHECK(got == present[i] && (!got || v == model[i]), "get after remove %d", i);
    }
    /* re-insert some removed keys */
    for (int i = 0; i < N; i += 9) {
        CHECK(strmap_put(m, keys[i], 7) == 1, "reinsert %d", i);
        model[i] = 7;
        present[i] = 1;
        size++;
    }

    /* empty and very long keys */
    char *big = malloc(20001);
    memset(big, 'q', 20000);
    big[20000] = '\0';
    CHECK(strmap_put(m, "", 11) == 1, "put empty key");
    CHECK(strmap_put(m, big, 22) == 1, "put long key");
    big[19999] = 'r';
    CHECK(strmap_get(m, big, &v) == 0, "long key differs in last byte");
    big[19999] = 'q';
    CHECK(strmap_get(m, big, &v) == 1 && v == 22, "get long key");
    CHECK(strmap_get(m, "", &v) == 1 && v == 11, "get empty key");
    free(big);
    size += 2;

    int *hits = calloc(N, sizeof *hits);
    struct seen s = { 0, 0, 0, hits };
    strmap_foreach(m, visit, &s);
    long want_sum = 33;
    for (int i = 0; i < N; i++)
        if (present[i])
            want_sum += model[i];
    CHECK(s.count == size && s.count == strmap_size(m), "foreach count %zu want %zu", s.count, size);
    CHECK(s.sum == want_sum, "foreach sum %ld want %ld", s.sum, want_sum);
    CHECK(!s.dup, "foreach visited a key twice or with a wrong value");
    free(hits);

    /* remove everything, then reuse */
    for (int i = 0; i < N; i++)
        if (present[i])
            CHECK(strmap_remove(m, keys[i]) == 1, "final remove %d", i);
    CHECK(strmap_remove(m, "") == 1, "remove empty key");
    CHECK(strmap_size(m) == 1, "one long key left, size %zu", strmap_size(m));
    CHECK(strmap_put(m, "again", 1) == 1 && strmap_get(m, "again", &v) == 1 && v == 1, "reuse");
    strmap_free(m);
    strmap_free(NULL);

    /* many small maps */
    for (int k = 0; k < 50; k++) {
        strmap *t = strmap_new();
        for (int i = 0; i < 40; i++)
            strmap_put(t, keys[i], i);
        for (int i = 0; i < 40; i += 2)
            strmap_remove(t, keys[i]);
        CHECK(strmap_size(t) == 20, "small map size");
        strmap_free(t);
    }
    if (failures == 0)
        printf("DRIVER OK\n");
    return failures != 0;
}
