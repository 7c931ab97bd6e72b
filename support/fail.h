/* The one-line refusal the support library and the tools built on it return: the message in the caller's
 * buffer, -1 for the caller to return. */
#ifndef UATTN_SUPPORT_FAIL_H
#define UATTN_SUPPORT_FAIL_H

#include <stddef.h>

/* Formats the message into why[cap] (nothing when why is NULL or cap 0) and returns -1, so that a refusal
 * is one `return fail_with(why, cap, ...)`. */
int fail_with(char *why, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

#endif
