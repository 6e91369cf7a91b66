/* CORS as vLLM serves it (FastAPI's CORSMiddleware, from Starlette), with
 * vLLM's flags: --allowed-origins, --allowed-methods, --allowed-headers,
 * --allow-credentials. Off unless origins are given (vLLM allows "*" by
 * default; a local inference server should not answer browsers of other
 * sites unless told to).
 *
 *  - Every response to a request whose Origin is allowed carries
 *    Access-Control-Allow-Origin ("*" when any origin is allowed and
 *    credentials are not, else the origin itself with Vary: Origin) and
 *    Access-Control-Allow-Credentials when enabled.
 *  - A preflight (OPTIONS with Origin and Access-Control-Request-Method) is
 *    answered on every route, before authentication (browsers send it
 *    without credentials): 200 with the allowed methods and headers and
 *    Access-Control-Max-Age 600, or 400 naming what is disallowed. */
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include "server/srv_internal.h"

/* Every method Starlette lists for "*". */
static const char ALL_METHODS[] = "DELETE, GET, HEAD, OPTIONS, PATCH, POST, PUT";

static bool any_origin(const srv *s) {
    for (int i = 0; i < s->cfg.n_allowed_origins; i++)
        if (!strcmp(s->cfg.allowed_origins[i], "*")) return true;
    return false;
}

static bool origin_ok(const srv *s, const char *origin) {
    if (!origin || !s->cfg.n_allowed_origins) return false;
    for (int i = 0; i < s->cfg.n_allowed_origins; i++)
        if (!strcmp(s->cfg.allowed_origins[i], "*") || !strcmp(s->cfg.allowed_origins[i], origin)) return true;
    return false;
}

/* Whether item (len bytes) is in the ", "-joined list (case-insensitive), or the list is "*". */
static bool in_list(const char *list, const char *item, size_t len) {
    if (!list || !strcmp(list, "*")) return true;
    for (const char *p = list; *p;) {
        while (*p == ' ' || *p == ',') p++;
        const char *e = p;
        while (*e && *e != ',') e++;
        size_t n = (size_t)(e - p);
        while (n && p[n - 1] == ' ') n--;
        if (n == 1 && *p == '*') return true;
        if (n == len && !strncasecmp(p, item, len)) return true;
        p = e;
    }
    return false;
}

static void allow_origin(const srv *s, struct MHD_Response *r, const char *origin) {
    bool star = any_origin(s) && !s->cfg.allow_credentials;
    MHD_add_response_header(r, "Access-Control-Allow-Origin", star ? "*" : origin);
    if (!star) MHD_add_response_header(r, "Vary", "Origin");
    if (s->cfg.allow_credentials) MHD_add_response_header(r, "Access-Control-Allow-Credentials", "true");
}

void td_srv_cors_headers(srv *s, struct MHD_Connection *c, struct MHD_Response *r) {
    if (!s->cfg.n_allowed_origins || !r) return;
    const char *origin = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Origin");
    if (origin_ok(s, origin)) allow_origin(s, r, origin);
}

bool td_srv_cors_is_preflight(srv *s, struct MHD_Connection *c, const char *method) {
    return s->cfg.n_allowed_origins && !strcmp(method, "OPTIONS") && MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Origin") &&
           MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Access-Control-Request-Method");
}

enum MHD_Result td_srv_cors_preflight(srv *s, struct MHD_Connection *c) {
    const char *origin = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Origin");
    const char *rm = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Access-Control-Request-Method");
    const char *rh = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Access-Control-Request-Headers");
    const char *why = NULL;
    if (!origin_ok(s, origin)) why = "origin";
    else if (!in_list(s->cfg.allowed_methods, rm, strlen(rm))) why = "method";
    for (const char *p = rh; p && *p && !why;) { /* each requested header */
        while (*p == ' ' || *p == ',') p++;
        const char *e = p;
        while (*e && *e != ',') e++;
        size_t n = (size_t)(e - p);
        while (n && p[n - 1] == ' ') n--;
        if (n && !in_list(s->cfg.allowed_headers, p, n)) why = "headers";
        p = e;
    }
    char body[64];
    snprintf(body, sizeof body, why ? "Disallowed CORS %s" : "OK", why);
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_COPY);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/plain; charset=utf-8");
    if (origin_ok(s, origin)) allow_origin(s, r, origin);
    if (!why) {
        const char *m = s->cfg.allowed_methods && strcmp(s->cfg.allowed_methods, "*") ? s->cfg.allowed_methods : ALL_METHODS;
        MHD_add_response_header(r, "Access-Control-Allow-Methods", m);
        /* "*": the headers asked for, as Starlette echoes them */
        const char *h = s->cfg.allowed_headers && strcmp(s->cfg.allowed_headers, "*") ? s->cfg.allowed_headers : rh;
        if (h && *h) MHD_add_response_header(r, "Access-Control-Allow-Headers", h);
        MHD_add_response_header(r, "Access-Control-Max-Age", "600");
    }
    int status = why ? 400 : 200;
    enum MHD_Result q = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    td_metrics_http(&s->metrics, status);
    return q;
}
