/*
 * fork_child.c: a child made by fork() gets an error from every entry
 * point (but tlsf_version, which never fails: the parent's string), never
 * a hang, while the parent's threads allocate; the parent goes on. Each
 * child calls the library under alarm(5): a child that hangs dies of
 * SIGALRM and fails the check. Run with TLSF_ALLOC_CONF
 * naming device:sim (make capi-example does). Exits 0 when every check
 * passed, 1 otherwise.
 */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "tlsf.h"

enum { children = 20 };

static volatile int stop;
static char parent_version[512];

static void* churn(void* arg) {
  (void)arg;
  while (!stop) {
    void* p = tlsf_malloc(4096, 0, NULL);
    tlsf_free(p, 4096, 0, NULL);
  }
  return NULL;
}

/* child runs in a forked child: every call fails with the fork message. */
static int child(void) {
  alarm(5);
  tlsf_stats s;
  memset(&s, 0, sizeof s);
  s.size = sizeof s;
  int ok = tlsf_malloc(4096, 0, NULL) == NULL && strstr(tlsf_last_error(), "tlsf_malloc: called in a child made by fork()") != NULL;
  ok = ok && tlsf_get_stats(0, &s) == -1 && strstr(tlsf_last_error(), "fork()") != NULL;
  ok = ok && tlsf_trim(0) == 0 && strstr(tlsf_last_error(), "fork()") != NULL;
  ok = ok && tlsf_configure("device:sim") == -1;
  tlsf_free((void*)0x1000, 0, 0, NULL);
  ok = ok && strstr(tlsf_last_error(), "tlsf_free: called in a child") != NULL;
  /* tlsf_version never fails: the parent's string, read before the fork. */
  int abi = -1;
  ok = ok && strcmp(tlsf_version(&abi), parent_version) == 0 && abi == TLSF_ABI_VERSION && tlsf_last_error()[0] == 0;
  return ok ? 0 : 1;
}

/* early_child runs in a child forked before the parent read
 * tlsf_version: the fallback string, the same ABI version, no message. */
static int early_child(void) {
  alarm(5);
  int abi = -1;
  const char* v = tlsf_version(&abi);
  char want[64];
  snprintf(want, sizeof want, "github.com/gpumem/tlsf (unknown) abi=%d go=(unknown)", TLSF_ABI_VERSION);
  return strcmp(v, want) == 0 && abi == TLSF_ABI_VERSION && tlsf_last_error()[0] == 0 ? 0 : 1;
}

int main(void) {
  pid_t early = fork();
  if (early == 0) {
    _exit(early_child());
  }
  int st = 0;
  CHECK(early > 0 && waitpid(early, &st, 0) == early, "fork or waitpid failed");
  CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "a child forked before tlsf_version was read: not the fallback string");
  snprintf(parent_version, sizeof parent_version, "%s", tlsf_version(NULL));
  pthread_t t[2];
  for (int i = 0; i < 2; i++) {
    pthread_create(&t[i], NULL, churn, NULL);
  }
  for (int i = 0; i < children; i++) {
    pid_t pid = fork();
    if (pid == 0) {
      _exit(child());
    }
    int status = 0;
    CHECK(pid > 0 && waitpid(pid, &status, 0) == pid, "fork or waitpid failed");
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child %d: %s", i,
          WIFSIGNALED(status) ? (WTERMSIG(status) == SIGALRM ? "hung" : "killed by a signal") : "a call did not fail with the fork message");
  }
  stop = 1;
  for (int i = 0; i < 2; i++) {
    pthread_join(t[i], NULL);
  }
  void* p = tlsf_malloc(1 << 20, 0, NULL);
  CHECK(p != NULL, "the parent after its children: %s", tlsf_last_error());
  tlsf_free(p, 1 << 20, 0, NULL);
  if (failures == 0) {
    printf("fork_child: all checks passed\n");
  }
  return failures != 0;
}
