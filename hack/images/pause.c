// The pod sandbox's process (hack/image.sh pause builds it, statically linked, into the
// localhost/pause:muster image): it holds the pod's namespaces open by doing nothing. It sleeps
// in pause(), reaps the children it inherits (a pod sharing its process namespace makes it their
// init), and exits 0 on SIGINT or SIGTERM, which a PID 1 without a handler would ignore.
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int sig) {
  (void)sig;
  _exit(0);
}

static void reap(int sig) {
  (void)sig;
  int saved = errno;
  while (waitpid(-1, NULL, WNOHANG) > 0) {
  }
  errno = saved;
}

int main(void) {
  struct sigaction on_stop = {.sa_handler = stop};
  struct sigaction on_child = {.sa_handler = reap, .sa_flags = SA_NOCLDSTOP | SA_RESTART};
  sigemptyset(&on_stop.sa_mask);
  sigemptyset(&on_child.sa_mask);
  if (sigaction(SIGINT, &on_stop, NULL) != 0 || sigaction(SIGTERM, &on_stop, NULL) != 0 ||
      sigaction(SIGCHLD, &on_child, NULL) != 0) {
    perror("pause: sigaction");
    return 1;
  }
  for (;;) {
    pause();
  }
}
