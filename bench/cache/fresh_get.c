/* fresh_get: the cost of a GET on a fresh connection, the way ccache makes
 * one per compiler process (bench/cache/run.sh, issue 40 item 6).
 *
 *   fresh_get http  HOST PORT PATH  N GETS_PER_CONN
 *   fresh_get redis HOST PORT KEY   N GETS_PER_CONN
 *
 * N times: connect (TCP_NODELAY, as ccache's clients set it), send
 * GETS_PER_CONN requests one after another on that connection (HTTP/1.1
 * keep-alive, Content-Length framed; or RESP GET), read every reply whole,
 * close. Prints one line: "median_us p90_us p99_us mean_us bytes_per_get"
 * over the N connect-to-close times. Any non-200 answer or nil reply is
 * fatal, so a cold or misconfigured server cannot pass as a fast one.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static void die(const char *what) {
  fprintf(stderr, "fresh_get: %s: %s\n", what, errno ? strerror(errno) : "bad reply");
  exit(1);
}

static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static void write_all(int fd, const char *p, size_t n) {
  while (n) {
    ssize_t w = write(fd, p, n);
    if (w <= 0) die("write");
    p += w; n -= (size_t)w;
  }
}

/* A small read buffer over the socket. */
static char buf[1 << 20];
static size_t blen, bpos;
static int fill(int fd) {
  if (bpos == blen) { bpos = blen = 0; }
  if (blen == sizeof buf) die("reply too large");
  ssize_t r = read(fd, buf + blen, sizeof buf - blen);
  if (r <= 0) die("read");
  blen += (size_t)r;
  return 0;
}
/* Returns the index just past "\r\n\r\n" (http) or "\r\n" (redis). */
static size_t until(int fd, const char *delim) {
  for (;;) {
    char *e = memmem(buf + bpos, blen - bpos, delim, strlen(delim));
    if (e) return (size_t)(e - buf) + strlen(delim);
    fill(fd);
  }
}
static void skip(int fd, size_t n) {
  while (blen - bpos < n) { n -= blen - bpos; bpos = blen = 0; fill(fd); }
  bpos += n;
}

static size_t http_get(int fd, const char *host, const char *path) {
  char req[2048];
  int n = snprintf(req, sizeof req,
                   "GET %s HTTP/1.1\r\nHost: %s\r\nAccept: */*\r\n\r\n", path, host);
  write_all(fd, req, (size_t)n);
  size_t end = until(fd, "\r\n\r\n");
  if (strncmp(buf + bpos, "HTTP/1.1 200", 12) != 0) { errno = 0; die("HTTP status not 200"); }
  char *cl = memmem(buf + bpos, end - bpos, "ontent-Length:", 14);
  if (!cl) cl = memmem(buf + bpos, end - bpos, "ontent-length:", 14);
  if (!cl) { errno = 0; die("no Content-Length"); }
  size_t len = strtoul(cl + 14, NULL, 10);
  bpos = end;
  skip(fd, len);
  return len;
}

static size_t redis_get(int fd, const char *key) {
  char req[1024];
  int n = snprintf(req, sizeof req, "*2\r\n$3\r\nGET\r\n$%zu\r\n%s\r\n", strlen(key), key);
  write_all(fd, req, (size_t)n);
  size_t end = until(fd, "\r\n");
  if (buf[bpos] != '$') { errno = 0; die("redis reply is not a bulk string"); }
  long len = strtol(buf + bpos + 1, NULL, 10);
  if (len < 0) { errno = 0; die("redis key missing"); }
  bpos = end;
  skip(fd, (size_t)len + 2);
  return (size_t)len;
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

int main(int argc, char **argv) {
  if (argc != 7) {
    fprintf(stderr, "usage: fresh_get http|redis HOST PORT PATH|KEY N GETS_PER_CONN\n");
    return 2;
  }
  int redis = strcmp(argv[1], "redis") == 0;
  const char *host = argv[2], *what = argv[4];
  int port = atoi(argv[3]), n = atoi(argv[5]), per = atoi(argv[6]);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  if (inet_pton(AF_INET, host, &sa.sin_addr) != 1) die("host must be an IPv4 address");
  char hosthdr[128];
  snprintf(hosthdr, sizeof hosthdr, "%s:%d", host, port);
  double *t = calloc((size_t)n, sizeof *t), sum = 0;
  size_t bytes = 0;
  for (int i = 0; i < n; i++) {
    double t0 = now_us();
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) die("socket");
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) die("connect");
    blen = bpos = 0;
    for (int k = 0; k < per; k++) bytes = redis ? redis_get(fd, what) : http_get(fd, hosthdr, what);
    close(fd);
    t[i] = now_us() - t0;
    sum += t[i];
  }
  qsort(t, (size_t)n, sizeof *t, cmp);
  printf("%.1f %.1f %.1f %.1f %zu\n", t[n / 2], t[(int)(n * 0.90)], t[(int)(n * 0.99)], sum / n, bytes);
  return 0;
}
