/* openai_structured.c — the structured-output parameters of a completion request, turned
 * into one compiled grammar (grammar/grammar.h) that the engine applies as a token mask.
 *
 * Accepted, at most one per request (both endpoints):
 *   response_format     {"type": "text"} (no constraint) | {"type": "json_object"} |
 *                       {"type": "json_schema", "json_schema": {"name", "schema",
 *                       "strict"?, "description"?}}                    (OpenAI)
 *   guided_json         a schema object, or a string holding one       (vLLM, older)
 *   guided_regex        a regular expression for the whole output
 *   guided_choice       a non-empty array of strings: the output is exactly one of them
 *   guided_grammar      a GBNF grammar (start rule `root`; vLLM's EBNF)
 *   grammar             the same (llama.cpp's server)
 *   structured_outputs  {"json": schema | string} | {"regex": string} |
 *                       {"choice": [strings]} | {"grammar": string} |
 *                       {"json_object": true}                          (vLLM, newer)
 * structured_outputs.structural_tag is not implemented: 400 naming it. Errors are 400
 * invalid_request_error with param naming the parameter and, for a schema, regex or
 * grammar the compiler refuses, its own message.
 *
 * Invariants: on success r->grammar holds the request's one reference and r->rp.grammar
 * points at it; on failure r->grammar is untouched. Pure over the read-only ctx: any
 * thread.
 */
#include "api/openai.h"
#include "api/openai_internal.h"
#include "grammar/grammar.h"
#include "util/err.h"

#include <cjson/cJSON.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_CHOICES 1024 /* guided_choice entries; the compiler bounds the total size */

int oai_attach_grammar(const struct oai_ctx *ctx, struct oai_request *r,
                       const struct grammar_spec *spec, const char *param, struct api_error *e)
{
    if (r->grammar)
        return oai_bad(e, param, "'%s' cannot be combined with another output constraint (response_format "
                   "json_object / json_schema, guided_*, structured_outputs or tool_choice): use one", param);
    if (!ctx->gv) return oai_bad(e, param, "'%s': structured output is not available on this server", param);
    char err[ERR_BUF];
    struct grammar *g = NULL;
    int rc = grammar_compile(&g, ctx->gv, spec, err, sizeof err);
    if (rc == ERR_NOMEM) return oai_nomem(e);
    if (rc) return oai_bad(e, param, "'%s': %s", param, err);
    r->grammar = g;
    r->rp.grammar = g;
    return 0;
}

/* One constraint found in the body, not yet compiled. */
struct constraint {
    char param[64];          /* the parameter, for errors ("structured_outputs.json") */
    struct grammar_spec spec;
    char *owned;             /* malloc'd text spec.text points into (a printed schema) */
    const char **choices;    /* malloc'd [n_choices] pointing into the body's strings */
};

static void constraint_free(struct constraint *c)
{
    free(c->owned);
    free(c->choices);
}

/* A schema given as an object (printed to text) or as a string holding one. */
static int schema_spec(const cJSON *v, const char *param, struct constraint *c, struct api_error *e)
{
    c->spec.kind = GRAMMAR_JSON_SCHEMA;
    if (cJSON_IsString(v)) {
        c->spec.text = v->valuestring;
        c->spec.text_len = strlen(v->valuestring);
        return 0;
    }
    if (!cJSON_IsObject(v) && !cJSON_IsBool(v))
        return oai_bad(e, param, "'%s' must be a JSON Schema (an object)", param);
    if (!(c->owned = cJSON_PrintUnformatted(v))) return oai_nomem(e);
    c->spec.text = c->owned;
    c->spec.text_len = strlen(c->owned);
    return 0;
}

/* A constraint given as a non-empty string of the compiler's language (what: for errors). */
static int text_spec(const cJSON *v, const char *param, enum grammar_kind kind, const char *what,
                     struct constraint *c, struct api_error *e)
{
    if (!cJSON_IsString(v) || !v->valuestring[0])
        return oai_bad(e, param, "'%s' must be a non-empty string (%s)", param, what);
    c->spec.kind = kind;
    c->spec.text = v->valuestring;
    c->spec.text_len = strlen(v->valuestring);
    return 0;
}

static int regex_spec(const cJSON *v, const char *param, struct constraint *c, struct api_error *e)
{
    return text_spec(v, param, GRAMMAR_REGEX, "a regular expression", c, e);
}

static int gbnf_spec(const cJSON *v, const char *param, struct constraint *c, struct api_error *e)
{
    return text_spec(v, param, GRAMMAR_GBNF, "a GBNF grammar with a 'root' rule", c, e);
}

static int choice_spec(const cJSON *v, const char *param, struct constraint *c, struct api_error *e)
{
    int n = cJSON_IsArray(v) ? cJSON_GetArraySize(v) : 0;
    if (n <= 0) return oai_bad(e, param, "'%s' must be a non-empty array of strings", param);
    if (n > MAX_CHOICES) return oai_bad(e, param, "'%s' may hold at most %d strings, got %d", param, MAX_CHOICES, n);
    if (!(c->choices = malloc(sizeof *c->choices * (size_t)n))) return oai_nomem(e);
    int i = 0;
    const cJSON *s;
    cJSON_ArrayForEach(s, v) {
        if (!cJSON_IsString(s) || !s->valuestring[0])
            return oai_bad(e, param, "'%s'[%d] must be a non-empty string", param, i);
        c->choices[i++] = s->valuestring;
    }
    c->spec.kind = GRAMMAR_CHOICE;
    c->spec.choices = c->choices;
    c->spec.n_choices = n;
    return 0;
}

/* response_format: 1 with c filled for json_object / json_schema, 0 for text or absent. */
static int parse_response_format(const cJSON *root, struct constraint *c, struct api_error *e)
{
    const char *P = "response_format";
    const cJSON *rf = oai_opt(root, P), *t = rf && cJSON_IsObject(rf) ? oai_opt(rf, "type") : NULL;
    if (!rf) return 0;
    if (!t || !cJSON_IsString(t))
        return oai_bad(e, P, "'response_format' must be an object with a string 'type' ('text', 'json_object' or "
                   "'json_schema')");
    snprintf(c->param, sizeof c->param, "%s", P);
    if (!strcmp(t->valuestring, "text")) return 0;
    if (!strcmp(t->valuestring, "json_object")) {
        c->spec.kind = GRAMMAR_JSON_OBJECT;
        return 1;
    }
    if (strcmp(t->valuestring, "json_schema") != 0)
        return oai_bad(e, P, "'response_format' type '%.64s' is not supported: use 'text', 'json_object' or "
                   "'json_schema'", t->valuestring);
    const cJSON *js = oai_opt(rf, "json_schema");
    if (!js) return oai_bad(e, P, "Missing required parameter: 'response_format.json_schema'");
    if (!cJSON_IsObject(js)) return oai_bad(e, P, "'response_format.json_schema' must be an object");
    const cJSON *name = oai_opt(js, "name"), *desc = oai_opt(js, "description"), *strict = oai_opt(js, "strict"),
                *schema = oai_opt(js, "schema");
    if (!name) return oai_bad(e, P, "Missing required parameter: 'response_format.json_schema.name'");
    size_t nl = cJSON_IsString(name) ? strlen(name->valuestring) : 0;
    if (nl == 0 || nl > 64 ||
        strspn(name->valuestring, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-") != nl)
        return oai_bad(e, P, "'response_format.json_schema.name' must be 1 to 64 characters of a-z, A-Z, 0-9, "
                   "'_' and '-'");
    if (desc && !cJSON_IsString(desc))
        return oai_bad(e, P, "'response_format.json_schema.description' must be a string");
    if (strict && !cJSON_IsBool(strict))
        return oai_bad(e, P, "'response_format.json_schema.strict' must be a boolean");
    if (!schema) return oai_bad(e, P, "Missing required parameter: 'response_format.json_schema.schema'");
    if (!cJSON_IsObject(schema) && !cJSON_IsBool(schema))
        return oai_bad(e, P, "'response_format.json_schema.schema' must be a JSON Schema (an object)");
    int rc = schema_spec(schema, P, c, e);
    return rc ? rc : 1;
}

/* structured_outputs: 1 with c filled, 0 when empty, or a negative code. */
static int parse_structured_outputs(const cJSON *root, struct constraint *c, struct api_error *e)
{
    const char *P = "structured_outputs";
    const cJSON *so = oai_opt(root, P), *it;
    if (!so) return 0;
    if (!cJSON_IsObject(so)) return oai_bad(e, P, "'structured_outputs' must be an object");
    const char *first = NULL;
    int rc = 0;
    cJSON_ArrayForEach(it, so) {
        const char *k = it->string;
        if (cJSON_IsNull(it)) continue;
        if (!strcmp(k, "json_object") && cJSON_IsFalse(it)) continue;
        bool known = !strcmp(k, "json") || !strcmp(k, "regex") || !strcmp(k, "choice") || !strcmp(k, "grammar") ||
                     !strcmp(k, "json_object");
        char param[64];
        snprintf(param, sizeof param, "%s.%.40s", P, k);
        if (!strcmp(k, "structural_tag"))
            return oai_bad(e, param, "'%s' is not supported: structural tags are not implemented; use 'json', "
                       "'regex', 'choice' or 'grammar'", param);
        if (!known)
            return oai_bad(e, param, "'%s' is not supported: structured_outputs takes one of 'json', 'regex', "
                       "'choice', 'grammar' or 'json_object'", param);
        if (first)
            return oai_bad(e, param, "'structured_outputs' must set one constraint, got '%s' and '%.40s'", first, k);
        first = k;
        snprintf(c->param, sizeof c->param, "%s", param);
        if (!strcmp(k, "json")) rc = schema_spec(it, param, c, e);
        else if (!strcmp(k, "regex")) rc = regex_spec(it, param, c, e);
        else if (!strcmp(k, "choice")) rc = choice_spec(it, param, c, e);
        else if (!strcmp(k, "grammar")) rc = gbnf_spec(it, param, c, e);
        else if (cJSON_IsTrue(it)) c->spec.kind = GRAMMAR_JSON_OBJECT;
        else rc = oai_bad(e, param, "'%s' must be a boolean", param);
        if (rc) return rc;
    }
    return first ? 1 : 0;
}

int oai_parse_structured(const struct oai_ctx *ctx, const cJSON *root, struct oai_request *r,
                         struct api_error *e)
{
    /* every source, in the order they are named in errors */
    enum { N_GUIDED = 5 };
    static const char *const guided[N_GUIDED] = { "guided_json", "guided_regex", "guided_choice", "guided_grammar",
                                                  "grammar" };
    static int (*const guided_spec[N_GUIDED])(const cJSON *, const char *, struct constraint *,
                                               struct api_error *) = { schema_spec, regex_spec, choice_spec,
                                                                       gbnf_spec, gbnf_spec };
    struct constraint cs[N_GUIDED + 2];
    memset(cs, 0, sizeof cs);
    int n = 0, rc;
    if ((rc = parse_response_format(root, &cs[n], e)) < 0) goto done;
    n += rc;
    for (int i = 0; i < N_GUIDED; i++) {
        const cJSON *v = oai_opt(root, guided[i]);
        if (!v) continue;
        struct constraint *c = &cs[n];
        snprintf(c->param, sizeof c->param, "%s", guided[i]);
        if ((rc = guided_spec[i](v, guided[i], c, e))) goto done;
        n++;
    }
    if ((rc = parse_structured_outputs(root, &cs[n], e)) < 0) goto done;
    n += rc;
    rc = 0;
    if (n > 1) {
        rc = oai_bad(e, cs[1].param, "'%s' and '%s' both constrain the output: a request may use only one of "
                 "response_format (json_object / json_schema), guided_json, guided_regex, guided_choice, "
                 "guided_grammar, grammar and structured_outputs", cs[0].param, cs[1].param);
        goto done;
    }
    if (n == 1) rc = oai_attach_grammar(ctx, r, &cs[0].spec, cs[0].param, e);
done:
    for (int i = 0; i < N_GUIDED + 2; i++) constraint_free(&cs[i]);
    return rc;
}
