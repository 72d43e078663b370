#ifndef LEGACY_H
#define LEGACY_H
/* Kept for old callers; nothing uses it any more. */
#define LEGACY_MODE 0
#endif
