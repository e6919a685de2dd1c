/*
 * check.h: the examples' CHECK(cond, format, ...): counts a failed
 * condition in `failures` and prints where it failed and why, without
 * stopping, so that one run reports every failed check.
 */
#ifndef TLSF_EXAMPLE_CHECK_H
#define TLSF_EXAMPLE_CHECK_H

#include <stdio.h>

static int failures;

#define CHECK(cond, ...)                                   \
  do {                                                     \
    if (!(cond)) {                                         \
      failures++;                                          \
      fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); \
      fprintf(stderr, __VA_ARGS__);                        \
      fprintf(stderr, "\n");                               \
    }                                                      \
  } while (0)

#endif /* TLSF_EXAMPLE_CHECK_H */
