/* jinja.h — a Jinja2 subset interpreter for chat templates.
 *
 * Renders byte-for-byte what Python jinja2 (ImmutableSandboxedEnvironment, trim_blocks,
 * lstrip_blocks, loopcontrols extension, default Undefined) renders, for the chat
 * templates of Hugging Face models. Globals: raise_exception(msg), strftime_now(fmt),
 * namespace(...); filters and string/dict/list methods those templates use; tojson as
 * transformers defines it. Anything outside the subset fails at parse time
 * (jinja_parse) with a message naming the line and construct, never at render time.
 *
 * Values come from a cJSON tree (the "context": messages, tools, add_generation_prompt,
 * bos_token, eos_token, ...). A parsed template is immutable and may be rendered from
 * any thread concurrently.
 */
#ifndef TESSERA_TEMPLATE_JINJA_H
#define TESSERA_TEMPLATE_JINJA_H

#include <stddef.h>
#include <stdint.h>

struct cJSON;
struct jinja_template;

/* Parses src[0..len) (UTF-8, need not be NUL-terminated; not referenced afterwards).
 * On success *out owns the template (free with jinja_free). On failure *out is NULL
 * and err holds "line N: <what>": ERR_FORMAT for malformed input (unterminated tags or
 * strings, unbalanced blocks, nesting beyond 256), ERR_UNSUPPORTED for constructs
 * outside the subset (unknown filter / test / tag / function / method). Any thread. */
int jinja_parse(const char *src, size_t len, struct jinja_template **out, char *err, size_t errlen);
/* Frees a template (NULL is fine). No render may be running on it. */
void jinja_free(struct jinja_template *t);

struct jinja_render_opts {
    /* strftime_now() formats this time (unix seconds, local = UTC); 0 means now. */
    int64_t now;
    /* If non-NULL, strftime_now() returns this string verbatim (tests). */
    const char *fixed_strftime;
};

/* Renders with the variables of the JSON object ctx. On success *out is a malloc'd
 * NUL-terminated string (caller frees) and *out_len its length. A raise_exception call
 * returns ERR_INVALID with exactly the exception's message in err; other runtime errors
 * (those jinja2 would raise: UndefinedError, TypeError, ...) ERR_INVALID with
 * "line N: <description>"; a render past its limits (256 MiB of values, 64 MiB of
 * output) ERR_NOMEM. opts may be NULL (strftime_now uses the current time). ctx is
 * only read, and must outlive the call. Any thread; concurrent renders of one template
 * are safe. */
int jinja_render(const struct jinja_template *t, const struct cJSON *ctx,
                 const struct jinja_render_opts *opts, char **out, size_t *out_len,
                 char *err, size_t errlen);

#endif
