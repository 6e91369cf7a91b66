/* Chat-template renderer: the subset of Jinja2 that real chat templates use,
 * with the environment of transformers' apply_chat_template (trim_blocks,
 * lstrip_blocks, loopcontrols, tojson with ensure_ascii=False,
 * raise_exception, strftime_now, namespace, dict).
 *
 * Why not a library: no Debian-packaged C library implements Jinja2 with
 * Python's value semantics (str() of floats and lists, dict ordering,
 * json.dumps formatting), and those details decide the exact bytes.
 *
 * Unknown syntax, filters, tests or methods are errors with the template
 * line and column, never silently different output. */
#ifndef TANDEM_TEMPLATE_H
#define TANDEM_TEMPLATE_H
#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include "tandem.h"

typedef struct tpl tpl;

/* Parses template source (len bytes). */
int td_tpl_parse(const char *src, size_t len, tpl **out, td_err *err);
void td_tpl_free(tpl *t);

/* Renders with the variables of the JSON object ctx (borrowed). *out is
 * malloc'd and NUL-terminated; *len excludes the NUL. A raise_exception()
 * in the template is an error whose message is the template's. */
int td_tpl_render(const tpl *t, const json_t *ctx, char **out, size_t *len, td_err *err);

/* apply_chat_template: messages (array), tools (array or NULL = None),
 * documents (array or NULL), add_generation_prompt, extra kwargs (object or
 * NULL: enable_thinking and any chat_template_kwargs), special-token
 * strings (NULL = not defined). Messages get transformers' reasoning
 * aliasing (reasoning_content / thinking / reasoning). */
typedef struct tpl_chat_args {
    const json_t *messages, *tools, *documents, *kwargs;
    bool add_generation_prompt;
    const char *bos_token, *eos_token, *pad_token, *unk_token;
} tpl_chat_args;
int td_tpl_apply_chat(const tpl *t, const tpl_chat_args *a, char **out, size_t *len, td_err *err);

#endif
