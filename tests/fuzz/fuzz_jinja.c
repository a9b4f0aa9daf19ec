/* fuzz_jinja.c — libFuzzer target for the template interpreter: the input is a template
 * source; it is parsed and, when valid, rendered against a fixed chat context (messages
 * with tool calls, tools, Unicode). Any crash, sanitizer report, leak or hang is a bug;
 * parse and render errors are expected outcomes.
 *
 *   clang -std=c11 -g -O1 -Isrc -fsanitize=fuzzer,address,undefined tests/fuzz/fuzz_jinja.c \
 *         $(find src/template -name '*.c') src/util/err.c -lcjson -lutf8proc -lm -o build/fuzz_jinja
 *   mkdir -p build/fuzz-corpus && cp build/testdata/templates/*.jinja build/fuzz-corpus/   (scripts/get-testdata.py)
 *   build/fuzz_jinja -max_total_time=60 -max_len=8192 -timeout=10 build/fuzz-corpus
 */
#include "template/jinja.h"
#include "util/err.h"

#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdlib.h>

static const char ctx_json[] =
    "{\"messages\":["
    "{\"role\":\"system\",\"content\":\"You are terse. \\u00e9\\u4f60\"},"
    "{\"role\":\"user\",\"content\":\"What is {{ 2+2 }}?\"},"
    "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"call12345\",\"type\":\"function\","
    "\"function\":{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Paris\",\"days\":3}}}]},"
    "{\"role\":\"tool\",\"tool_call_id\":\"call12345\",\"content\":\"21.5\"},"
    "{\"role\":\"assistant\",\"content\":\"<think>\\nhm\\n</think>\\n\\n4\"}],"
    "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"description\":\"Get weather\","
    "\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}},\"required\":[\"city\"]}}}],"
    "\"add_generation_prompt\":true,\"bos_token\":\"<s>\",\"eos_token\":\"</s>\",\"n\":3,\"f\":1.5,\"z\":null}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static cJSON *ctx;
    if (!ctx) ctx = cJSON_Parse(ctx_json);
    struct jinja_template *t = NULL;
    char err[ERR_BUF];
    if (jinja_parse((const char *)data, size, &t, err, sizeof err) == 0) {
        struct jinja_render_opts opts = { 0, "26 Jul 2024" };
        char *out = NULL;
        size_t n = 0;
        jinja_render(t, ctx, &opts, &out, &n, err, sizeof err);
        free(out);
        jinja_free(t);
    }
    return 0;
}
