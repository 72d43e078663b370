/* wordfreq [N]: reads text on stdin, prints the N (default 10) most frequent words as
 * "COUNT WORD" lines, most frequent first, ties in ascending byte order of the word.
 * A word is a maximal run of ASCII letters, compared lower-cased. */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "strmap.h"

struct item {
    const char *word;
    long count;
};

struct collect {
    struct item *items;
    size_t n;
};

static void add_item(const char *key, long value, void *ctx)
{
    struct collect *c = ctx;
    c->items[c->n].word = key;
    c->items[c->n].count = value;
    c->n++;
}

static int by_count(const void *a, const void *b)
{
    const struct item *x = a, *y = b;
    if (x->count != y->count)
        return x->count < y->count ? 1 : -1;
    return strcmp(x->word, y->word);
}

static int count_word(strmap *m, const char *w)
{
    long n = 0;
    strmap_get(m, w, &n);
    return strmap_put(m, w, n + 1) < 0 ? -1 : 0;
}

int main(int argc, char **argv)
{
    long top = argc > 1 ? atol(argv[1]) : 10;
    strmap *m = strmap_new();
    char word[32];
    size_t len = 0;
    int c;

    if (!m)
        return 1;
    while ((c = getchar()) != EOF) {
        if (isalpha(c)) {
            word[len++] = (char)tolower(c);
        } else if (len > 0) {
            word[len] = '\0';
            if (count_word(m, word) < 0)
                return 1;
            len = 0;
        }
    }
    if (len > 0) {
        word[len] = '\0';
        if (count_word(m, word) < 0)
            return 1;
    }

    struct collect col = { malloc((strmap_size(m) + 1) * sizeof(struct item)), 0 };
    if (!col.items)
        return 1;
    strmap_foreach(m, add_item, &col);
    qsort(col.items, col.n, sizeof *col.items, by_count);
    for (size_t i = 0; i < col.n && (long)i < top; i++)
        printf("%ld %s\n", col.items[i].count, col.items[i].word);
    free(col.items);
    strmap_free(m);
    return 0;
}
