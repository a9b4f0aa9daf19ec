/* chat.h — turns a conversation into the prompt text a model expects, with the model's
 * own chat template (src/template/jinja.h).
 *
 * The template context is the one Hugging Face transformers' apply_chat_template builds:
 * messages, tools (null unless given), add_generation_prompt, bos_token, eos_token, and
 * any extra variables (e.g. enable_thinking). Callable from any thread.
 */
#ifndef TESSERA_CHAT_H
#define TESSERA_CHAT_H

#include <stdbool.h>
#include <stddef.h>

struct cJSON;
struct jinja_template;

struct chat_specials {
    const char *bos_token; /* "" when the model has none */
    const char *eos_token;
};

/* Renders messages (a cJSON array of {"role", "content", ...} objects, borrowed) into
 * *out (malloc'd, NUL-terminated; caller frees). tools and extra may be NULL; extra is
 * an object whose members are added to the context. Returns 0, ERR_INVALID for a
 * malformed conversation or a template that raised (message in err). */
int chat_render(const struct jinja_template *tpl, const struct chat_specials *sp,
                const struct cJSON *messages, const struct cJSON *tools,
                const struct cJSON *extra, bool add_generation_prompt, char **out,
                size_t *out_len, char *err, size_t errlen);

/* Checks a messages array: non-empty, each an object with a known string role (system,
 * user, assistant, tool, developer) and content that is a string, null or an array of
 * {"type":"text","text":...} parts (left out only beside tool_calls). Writes what is
 * wrong, naming the index, into err. What a template sees for a null content is the API
 * layer's choice (api/openai_internal.h, oai_messages_for_template). */
int chat_validate_messages(const struct cJSON *messages, char *err, size_t errlen);

/* A validated message's content as the template sees it: the string, text parts joined
 * with "\n", or "" (null / left out). malloc'd; NULL when out of memory. */
char *chat_content_text(const struct cJSON *message);

#endif
