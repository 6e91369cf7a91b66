/* A tiny blocking HTTP/1.1 client: one request per connection
 * (Connection: close), Content-Length, chunked or until-close bodies,
 * streamed to a callback (for SSE). Plain http only: the benchmark talks
 * to a local server. Why not libcurl: see src/bench/README.md. */
#include <errno.h>
#include <netdb.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>
#include "bench/runner.h"
#include "util/err.h"

int td_bench_url_parse(const char *url, bench_url *u, td_err *err) {
    memset(u, 0, sizeof *u);
    const char *p = url;
    if (!strncmp(p, "https://", 8)) return TD_FAIL(err, TD_ERR_UNSUPPORTED, "%s: https is not supported (plain http to a local server)", url);
    if (!strncmp(p, "http://", 7)) p += 7;
    const char *hs = p, *he;
    if (*p == '[') { /* IPv6 literal */
        he = strchr(p, ']');
        if (!he) return TD_FAIL(err, TD_ERR_ARG, "%s: unterminated IPv6 address", url);
        hs = p + 1;
        p = he + 1;
    } else {
        while (*p && *p != ':' && *p != '/') p++;
        he = p;
    }
    size_t hl = (size_t)(he - hs);
    if (!hl || hl >= sizeof u->host) return TD_FAIL(err, TD_ERR_ARG, "%s: no host", url);
    memcpy(u->host, hs, hl);
    snprintf(u->port, sizeof u->port, "80");
    if (*p == ':') {
        p++;
        size_t n = strspn(p, "0123456789");
        if (!n || n > 5) return TD_FAIL(err, TD_ERR_ARG, "%s: bad port", url);
        memcpy(u->port, p, n);
        u->port[n] = 0;
        p += n;
    }
    if (*p && *p != '/') return TD_FAIL(err, TD_ERR_ARG, "%s: unexpected \"%s\"", url, p);
    snprintf(u->path, sizeof u->path, "%s", p);
    size_t pl = strlen(u->path);
    while (pl && u->path[pl - 1] == '/') u->path[--pl] = 0;
    /* a base URL ending in /v1 (as OpenAI clients take it) means the server root */
    if (pl >= 3 && !strcmp(u->path + pl - 3, "/v1")) u->path[pl - 3] = 0;
    return TD_OK;
}

static int dial(const bench_url *u, double timeout_s, td_err *err) {
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res = NULL;
    int g = getaddrinfo(u->host, u->port, &hints, &res);
    if (g) return TD_FAIL(err, TD_ERR_IO, "%s:%s: %s", u->host, u->port, gai_strerror(g));
    int fd = -1, last = 0;
    for (struct addrinfo *a = res; a && fd < 0; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) { last = errno; continue; }
        struct timeval tv = {.tv_sec = (time_t)timeout_s, .tv_usec = (suseconds_t)((timeout_s - (double)(time_t)timeout_s) * 1e6)};
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
        if (connect(fd, a->ai_addr, a->ai_addrlen) < 0) { last = errno; close(fd); fd = -1; }
    }
    freeaddrinfo(res);
    if (fd < 0) return TD_FAIL(err, TD_ERR_IO, "cannot connect to %s:%s: %s", u->host, u->port, strerror(last));
    return fd;
}

static int send_all(int fd, const char *p, size_t n, td_err *err) {
    while (n) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return TD_FAIL(err, TD_ERR_IO, "send: %s", strerror(errno));
        p += w;
        n -= (size_t)w;
    }
    return TD_OK;
}

/* Body decoder state. */
typedef struct rd {
    int fd;
    char buf[16384];
    size_t len, pos;
    bool eof;
} rd;

static int fill(rd *r, td_err *err) {
    if (r->pos == r->len) r->pos = r->len = 0;
    if (r->len == sizeof r->buf) {
        if (!r->pos) return TD_FAIL(err, TD_ERR_FORMAT, "HTTP line too long");
        memmove(r->buf, r->buf + r->pos, r->len - r->pos);
        r->len -= r->pos;
        r->pos = 0;
    }
    for (;;) {
        ssize_t n = recv(r->fd, r->buf + r->len, sizeof r->buf - r->len, 0);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return TD_FAIL(err, TD_ERR_IO, "recv: %s", errno == EAGAIN || errno == EWOULDBLOCK ? "timed out" : strerror(errno));
        if (n == 0) r->eof = true;
        r->len += (size_t)n;
        return TD_OK;
    }
}

/* Reads one CRLF-terminated line (without it) into out. */
static int read_line(rd *r, char *out, size_t cap, td_err *err) {
    for (;;) {
        char *nl = memchr(r->buf + r->pos, '\n', r->len - r->pos);
        if (nl) {
            size_t n = (size_t)(nl - (r->buf + r->pos));
            size_t m = n && r->buf[r->pos + n - 1] == '\r' ? n - 1 : n;
            if (m >= cap) return TD_FAIL(err, TD_ERR_FORMAT, "HTTP header line too long");
            memcpy(out, r->buf + r->pos, m);
            out[m] = 0;
            r->pos += n + 1;
            return TD_OK;
        }
        if (r->eof) return TD_FAIL(err, TD_ERR_IO, "connection closed in the middle of the HTTP headers");
        int rc = fill(r, err);
        if (rc) return rc;
    }
}

/* Passes up to `want` body bytes (or all until EOF when want < 0). */
static int pass_body(rd *r, long long want, bench_http_fn fn, void *user, bool *stop, td_err *err) {
    while (want != 0 && !*stop) {
        if (r->pos == r->len) {
            if (r->eof) {
                if (want > 0) return TD_FAIL(err, TD_ERR_IO, "connection closed with %lld body bytes missing", want);
                return TD_OK;
            }
            int rc = fill(r, err);
            if (rc) return rc;
            continue;
        }
        size_t n = r->len - r->pos;
        if (want > 0 && (long long)n > want) n = (size_t)want;
        if (fn && fn(user, r->buf + r->pos, n)) *stop = true;
        r->pos += n;
        if (want > 0) want -= (long long)n;
    }
    return TD_OK;
}

int td_bench_http(const bench_url *u, const char *method, const char *path, const char *extra, const char *body, size_t body_len,
               double timeout_s, int *status, bench_http_fn fn, void *user, td_err *err) {
    *status = 0;
    int fd = dial(u, timeout_s, err);
    if (fd < 0) return fd;
    char head[2048];
    bool ipv6 = strchr(u->host, ':') != NULL;
    int hn = snprintf(head, sizeof head,
                      "%s %s%s HTTP/1.1\r\nHost: %s%s%s:%s\r\nConnection: close\r\nAccept: */*\r\nUser-Agent: tandem-bench\r\n%s",
                      method, u->path, path, ipv6 ? "[" : "", u->host, ipv6 ? "]" : "", u->port, extra ? extra : "");
    if (body && hn > 0 && (size_t)hn < sizeof head)
        hn += snprintf(head + hn, sizeof head - (size_t)hn, "Content-Type: application/json\r\nContent-Length: %zu\r\n", body_len);
    if (hn > 0 && (size_t)hn < sizeof head) hn += snprintf(head + hn, sizeof head - (size_t)hn, "\r\n");
    if (hn <= 0 || (size_t)hn >= sizeof head) { close(fd); return TD_FAIL(err, TD_ERR_ARG, "HTTP request head too long"); }
    int rc = send_all(fd, head, (size_t)hn, err);
    if (!rc && body) rc = send_all(fd, body, body_len, err);
    rd *r = rc ? NULL : calloc(1, sizeof *r);
    if (!rc && !r) rc = TD_FAIL(err, TD_ERR_NOMEM, "out of memory");
    if (rc) { close(fd); free(r); return rc; }
    r->fd = fd;
    char line[8192];
    long long clen = -1;
    bool chunked = false;
    rc = read_line(r, line, sizeof line, err);
    if (!rc) {
        int maj = 0, min = 0;
        if (sscanf(line, "HTTP/%d.%d %d", &maj, &min, status) != 3) rc = TD_FAIL(err, TD_ERR_FORMAT, "not an HTTP response: \"%.80s\"", line);
    }
    while (!rc) {
        if ((rc = read_line(r, line, sizeof line, err))) break;
        if (!line[0]) break;
        if (!strncasecmp(line, "content-length:", 15)) clen = atoll(line + 15);
        else if (!strncasecmp(line, "transfer-encoding:", 18) && strcasestr(line + 18, "chunked")) chunked = true;
    }
    bool stop = false;
    if (!rc && !chunked) {
        rc = pass_body(r, clen >= 0 ? clen : -1, fn, user, &stop, err);
    } else if (!rc) {
        while (!rc && !stop) {
            if ((rc = read_line(r, line, sizeof line, err))) break;
            char *end;
            long long n = strtoll(line, &end, 16);
            if (end == line || n < 0) { rc = TD_FAIL(err, TD_ERR_FORMAT, "bad chunk size \"%.40s\"", line); break; }
            if (n == 0) break;
            if ((rc = pass_body(r, n, fn, user, &stop, err))) break;
            if (!stop) rc = read_line(r, line, sizeof line, err); /* CRLF after the chunk */
        }
    }
    close(fd);
    free(r);
    return rc;
}

typedef struct collect {
    char *p;
    size_t len, cap;
    bool oom;
} collect;

static int collect_fn(void *u, const char *d, size_t n) {
    collect *c = u;
    if (c->len + n + 1 > c->cap) {
        size_t cap = c->cap ? c->cap : 4096;
        while (cap < c->len + n + 1) cap *= 2;
        char *p = realloc(c->p, cap);
        if (!p) { c->oom = true; return 1; }
        c->p = p;
        c->cap = cap;
    }
    memcpy(c->p + c->len, d, n);
    c->len += n;
    c->p[c->len] = 0;
    return 0;
}

int td_bench_http_fetch(const bench_url *u, const char *method, const char *path, const char *extra, const char *body, double timeout_s,
                     int *status, char **out, size_t *len, td_err *err) {
    collect c = {0};
    int rc = td_bench_http(u, method, path, extra, body, body ? strlen(body) : 0, timeout_s, status, collect_fn, &c, err);
    if (!rc && c.oom) rc = TD_FAIL(err, TD_ERR_NOMEM, "out of memory reading the response");
    if (!rc && !c.p) c.p = calloc(1, 1);
    if (rc || !c.p) { free(c.p); return rc ? rc : TD_FAIL(err, TD_ERR_NOMEM, "out of memory"); }
    *out = c.p;
    if (len) *len = c.len;
    return TD_OK;
}
