/* test_tokenizer.c — unit tests of the tokenizer: the GPT-2 byte alphabet, BPE merge
 * order on tiny hand-made vocabularies, added-token matching, the streaming decoder with
 * split multi-byte characters, malformed tokenizer.json inputs (each refused with a
 * message), SentencePiece-style BPE (byte fallback, unk fusing, Prepend/Replace
 * normalizers, Metaspace, the decoder's leading-space strip) on a hand-made vocabulary,
 * and a few ids of the real tokenizers: Qwen3's tokenizer.json and llama.cpp's GGUF
 * vocabularies from the reference data (scripts/get-testdata.py) and the default model's
 * GGUF vocabulary; any of them missing is a failure. The full comparison with Hugging
 * Face is tests/python (test_tokenizer.py, test_tokenizer_vocabs.py).
 */
#include "tokenizer/tok_internal.h"

#include "loader/gguf.h"
#include "test.h"
#include "util/err.h"
#include "util/mapfile.h"

#include <pthread.h>
#include <stdint.h>

/* A byte-level tokenizer.json around the given vocab/merges/extra members. */
static struct tokenizer *load_tiny(const char *vocab, const char *merges, const char *pre, char *err)
{
    char json[16384];
    snprintf(json, sizeof json,
             "{\"model\": {\"type\": \"BPE\", \"vocab\": {%s}, \"merges\": [%s]}, \"pre_tokenizer\": %s,"
             " \"decoder\": {\"type\": \"ByteLevel\"}}",
             vocab, merges,
             pre ? pre : "{\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": true}");
    struct tokenizer *t = NULL;
    int rc = tok_load_hf_json_buf(json, strlen(json), &t, err, ERR_BUF);
    if (rc < 0)
        return NULL;
    return t;
}

static int enc(const struct tokenizer *t, const char *s, int32_t *ids, int cap)
{
    return tok_encode(t, s, strlen(s), false, true, ids, cap);
}

static void test_byte_alphabet(void)
{
    char c[2];
    CHECK(tok_byte_to_char(' ', c) == 2 && (uint8_t)c[0] == 0xC4 && (uint8_t)c[1] == 0xA0, "space is not Ġ");
    CHECK(tok_byte_to_char('\n', c) == 2 && (uint8_t)c[0] == 0xC4 && (uint8_t)c[1] == 0x8A, "newline is not Ċ");
    CHECK(tok_byte_to_char('a', c) == 1 && c[0] == 'a', "a maps to itself");
    CHECK(tok_byte_to_char(0xAD, c) == 2 && (uint8_t)c[0] == 0xC5 && (uint8_t)c[1] == 0x83, "0xAD is not U+0143");
    /* all 256 bytes map to distinct characters and back */
    char all[512];
    int n = 0;
    for (int b = 0; b < 256; b++)
        n += tok_byte_to_char((uint8_t)b, all + n);
    char back[256];
    CHECK(tok_chars_to_bytes(all, (size_t)n, back) == 256, "round trip length");
    for (int b = 0; b < 256; b++)
        CHECK((uint8_t)back[b] == b, "byte %d came back as %d", b, (uint8_t)back[b]);
    CHECK(tok_chars_to_bytes("\xe4\xb8\x80", 3, back) == -1, "a CJK character is not in the alphabet");
}

static void test_utf8_validation(void)
{
    CHECK(tok_utf8_valid_len((const uint8_t *)"\xc3\xa9", 2) == 2, "é");
    CHECK(tok_utf8_valid_len((const uint8_t *)"\xc0\xaf", 2) == 0, "overlong");
    CHECK(tok_utf8_valid_len((const uint8_t *)"\xed\xa0\x80", 3) == 0, "surrogate");
    CHECK(tok_utf8_valid_len((const uint8_t *)"\xf4\x90\x80\x80", 4) == 0, "> U+10FFFF");
    CHECK(tok_utf8_valid_len((const uint8_t *)"\xe2\x82", 2) == 0, "truncated");
    CHECK(tok_utf8_valid_len((const uint8_t *)"\xf0\x9f\x98\x80", 4) == 4, "emoji");
}

static void test_bpe_merge_order(void)
{
    char err[ERR_BUF];
    int32_t ids[16];
    const char *vocab = "\"a\": 0, \"b\": 1, \"c\": 2, \"ab\": 3, \"bc\": 4, \"abc\": 5";
    /* b+c ranks first, then a+bc */
    struct tokenizer *t = load_tiny(vocab, "\"b c\", \"a b\", \"a bc\"", NULL, err);
    CHECK(t, "load: %s", err);
    if (t) {
        CHECK(enc(t, "abc", ids, 16) == 1 && ids[0] == 5, "abc -> [abc]");
        CHECK(enc(t, "ab", ids, 16) == 1 && ids[0] == 3, "ab -> [ab]");
        tok_free(t);
    }
    /* a+b first, and there is no "ab c" merge: abc stays ab, c */
    t = load_tiny(vocab, "[\"a\", \"b\"], [\"b\", \"c\"]", NULL, err);
    CHECK(t, "load: %s", err);
    if (t) {
        int n = enc(t, "abc", ids, 16);
        CHECK(n == 2 && ids[0] == 3 && ids[1] == 2, "abc -> [ab, c], got n=%d", n);
        tok_free(t);
    }
    /* ties: the leftmost pair merges first (aaa -> aa, a) */
    t = load_tiny("\"a\": 0, \"aa\": 1", "\"a a\"", NULL, err);
    CHECK(t, "load: %s", err);
    if (t) {
        int n = enc(t, "aaa", ids, 16);
        CHECK(n == 2 && ids[0] == 1 && ids[1] == 0, "aaa -> [aa, a], got n=%d", n);
        n = enc(t, "aaaa", ids, 16);
        CHECK(n == 2 && ids[0] == 1 && ids[1] == 1, "aaaa -> [aa, aa]");
        /* cap smaller than the count: total returned, only cap written */
        ids[1] = -7;
        CHECK(enc(t, "aaaaa", ids, 1) == 3 && ids[1] == -7, "cap respected");
        tok_free(t);
    }
    /* bytes missing from the vocabulary are dropped (HF without unk_token) */
    t = load_tiny("\"a\": 0", "", NULL, err);
    CHECK(t, "load: %s", err);
    if (t) {
        CHECK(enc(t, "a!a", ids, 16) == 2, "unknown byte dropped");
        tok_free(t);
    }
}

static void test_ignore_merges_and_added(void)
{
    char err[ERR_BUF];
    int32_t ids[16];
    /* with ignore_merges a vocab word wins even without a merge path */
    char json[1024];
    snprintf(json, sizeof json,
             "{\"model\": {\"type\": \"BPE\", \"ignore_merges\": true, \"vocab\": {\"x\": 0, \"y\": 1, \"z\": 2, "
             "\"xyz\": 3}, \"merges\": []}, \"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false},"
             " \"decoder\": {\"type\": \"ByteLevel\"}, \"added_tokens\": ["
             "{\"id\": 4, \"content\": \"<s>\", \"special\": true},"
             "{\"id\": 5, \"content\": \"<tool>\", \"special\": false},"
             "{\"id\": 6, \"content\": \"<tool>x\", \"special\": false}],"
             " \"post_processor\": {\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": {\"id\": \"<s>\"}},"
             " {\"Sequence\": {\"id\": \"A\"}}], \"special_tokens\": {\"<s>\": {\"id\": \"<s>\", \"ids\": [4]}}}}");
    struct tokenizer *t = NULL;
    CHECK(tok_load_hf_json_buf(json, strlen(json), &t, err, sizeof err) == 0, "load: %s", err);
    if (!t)
        return;
    CHECK(enc(t, "xyz", ids, 16) == 1 && ids[0] == 3, "ignore_merges");
    CHECK(tok_bos_id(t) == 4 && tok_adds_bos(t), "BOS from the template");
    int n = tok_encode(t, "<s>x<tool>xy", 12, true, true, ids, 16);
    CHECK(n == 5 && ids[0] == 4 && ids[1] == 4 && ids[2] == 0 && ids[3] == 6 && ids[4] == 1,
          "BOS, <s>, x, longest added match <tool>x, y: n=%d", n);
    n = tok_encode(t, "<s>", 3, false, false, ids, 16);
    CHECK(n == 0, "parse_special=false: '<s>' is plain text (bytes not in vocab -> dropped), n=%d", n);
    n = tok_encode(t, "<tool>", 6, false, false, ids, 16);
    CHECK(n == 1 && ids[0] == 5, "non-special added tokens still match with parse_special=false");
    CHECK(tok_is_special(t, 4) && !tok_is_special(t, 5) && !tok_is_special(t, 0), "special flags");
    CHECK(tok_find(t, "xyz") == 3 && tok_find(t, "<tool>") == 5 && tok_find(t, "nope") == -1, "tok_find");
    tok_set_adds_bos(t, false);
    CHECK(!tok_adds_bos(t) && tok_encode(t, "x", 1, true, true, ids, 16) == 1, "BOS off");
    char buf[8];
    CHECK(tok_token_bytes(t, 4, true, buf, 8) == 0, "skip special");
    CHECK(tok_token_bytes(t, 4, false, buf, 8) == 3 && memcmp(buf, "<s>", 3) == 0, "special text");
    CHECK(tok_token_bytes(t, 99, false, buf, 8) < 0, "bad id");
    int32_t dec_ids[] = { 4, 3, 5 };
    char *s = tok_decode(t, dec_ids, 3, true);
    CHECK(s && strcmp(s, "xyz<tool>") == 0, "decode: %s", s ? s : "(null)");
    free(s);
    tok_free(t);
}

/* Byte-level vocabulary of single bytes only: ids are the byte values. */
static struct tokenizer *load_bytes(const char *pre, char *err)
{
    static char vocab[8192];
    int o = 0;
    for (int b = 0; b < 256; b++) {
        char c[2];
        int n = tok_byte_to_char((uint8_t)b, c);
        o += snprintf(vocab + o, sizeof vocab - (size_t)o, "%s\"", b ? ", " : "");
        if (c[0] == '"' || c[0] == '\\')
            vocab[o++] = '\\';
        memcpy(vocab + o, c, (size_t)n);
        o += n;
        o += snprintf(vocab + o, sizeof vocab - (size_t)o, "\": %d", b);
    }
    return load_tiny(vocab, "", pre, err);
}

static void test_stream_decoder(void)
{
    char err[ERR_BUF];
    struct tokenizer *t = load_bytes(NULL, err);
    CHECK(t, "load: %s", err);
    if (!t)
        return;
    struct tok_stream st;
    char out[64];
    tok_stream_init(&st);
    /* "é" = C3 A9 split over two tokens */
    CHECK(tok_stream_feed(t, &st, 0xC3, false, out, sizeof out) == 0 && out[0] == 0, "held");
    CHECK(tok_stream_feed(t, &st, 0xA9, false, out, sizeof out) == 2 && strcmp(out, "\xc3\xa9") == 0, "é");
    /* a 4-byte emoji over four tokens, then ASCII */
    const uint8_t emoji[4] = { 0xF0, 0x9F, 0x98, 0x80 };
    for (int i = 0; i < 3; i++)
        CHECK(tok_stream_feed(t, &st, emoji[i], false, out, sizeof out) == 0, "emoji byte %d held", i);
    CHECK(tok_stream_feed(t, &st, emoji[3], false, out, sizeof out) == 4 && memcmp(out, emoji, 4) == 0, "emoji");
    CHECK(tok_stream_feed(t, &st, 'x', false, out, sizeof out) == 1 && strcmp(out, "x") == 0, "ascii");
    /* an invalid byte becomes U+FFFD; a lead byte interrupted by ASCII too */
    CHECK(tok_stream_feed(t, &st, 0xFF, false, out, sizeof out) == 3 && strcmp(out, "\xef\xbf\xbd") == 0, "FFFD");
    CHECK(tok_stream_feed(t, &st, 0xE2, false, out, sizeof out) == 0, "lead held");
    CHECK(tok_stream_feed(t, &st, 'y', false, out, sizeof out) == 4 && strcmp(out, "\xef\xbf\xbdy") == 0,
          "broken sequence -> FFFD then y");
    /* too small a buffer: error, state unchanged, retry works */
    CHECK(tok_stream_feed(t, &st, 0xC3, false, out, sizeof out) == 0, "held again");
    CHECK(tok_stream_feed(t, &st, 0xA9, false, out, 2) == ERR_RANGE, "cap too small");
    CHECK(tok_stream_feed(t, &st, 0xA9, false, out, sizeof out) == 2, "retry after cap error");
    /* flush: a pending partial character becomes U+FFFD */
    CHECK(tok_stream_feed(t, &st, 0xF0, false, out, sizeof out) == 0, "partial");
    CHECK(tok_stream_flush(&st, out, sizeof out) == 3 && strcmp(out, "\xef\xbf\xbd") == 0, "flush");
    CHECK(tok_stream_flush(&st, out, sizeof out) == 0, "flush is idempotent");
    CHECK(tok_stream_feed(t, &st, 1000, false, out, sizeof out) < 0, "bad id refused");
    /* raw encode of invalid UTF-8 gives its byte tokens back */
    int32_t ids[16];
    const char bad[] = "a\xff\xc3";
    int n = tok_encode(t, bad, 3, false, true, ids, 16);
    CHECK(n == 3 && ids[0] == 'a' && ids[1] == 0xFF && ids[2] == 0xC3, "invalid bytes -> byte tokens, n=%d", n);
    tok_free(t);
}

static void test_malformed_json(void)
{
    static const char *const bad[] = {
        "",
        "{",
        "[]",
        "{\"model\": 3}",
        "{\"model\": {\"type\": \"Unigram\", \"vocab\": []}}",
        "{\"model\": {\"type\": \"BPE\", \"vocab\": []}}",
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {}}}",
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": -1}}}",
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 1.5}}}",
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 1e12}}}",
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": \"0\"}}}",
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [\"a\"]}}",
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [\"a b\"]}}",
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [\"a a\"]}}",
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [[\"a\"]]}}",
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": 7}}",
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"byte_fallback\": true}}",
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"dropout\": 0.1}}",
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}}}", /* no ByteLevel */
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}}, \"pre_tokenizer\": {\"type\": \"Whitespace\"}}",
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}}, \"pre_tokenizer\": {\"type\": \"Split\","
        " \"pattern\": {\"Regex\": \"(\"}, \"behavior\": \"Isolated\"}}",
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}}, \"pre_tokenizer\": {\"type\": \"Split\","
        " \"pattern\": {\"Regex\": \"a\"}, \"behavior\": \"Sideways\"}}",
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}}, \"pre_tokenizer\": {\"type\": \"Sequence\","
        " \"pretokenizers\": [{\"type\": \"ByteLevel\"}, {\"type\": \"Digits\"}]}}",
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}}, \"pre_tokenizer\": {\"type\": \"ByteLevel\"},"
        " \"normalizer\": {\"type\": \"Lowercase\"}, \"decoder\": {\"type\": \"ByteLevel\"}}",
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}}, \"pre_tokenizer\": {\"type\": \"ByteLevel\"}}",
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}}, \"pre_tokenizer\": {\"type\": \"ByteLevel\"},"
        " \"decoder\": {\"type\": \"ByteLevel\"}, \"added_tokens\": {}}",
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}}, \"pre_tokenizer\": {\"type\": \"ByteLevel\"},"
        " \"decoder\": {\"type\": \"ByteLevel\"}, \"added_tokens\": [{\"content\": \"x\"}]}",
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}}, \"pre_tokenizer\": {\"type\": \"ByteLevel\"},"
        " \"decoder\": {\"type\": \"ByteLevel\"}, \"post_processor\": {\"type\": \"TemplateProcessing\","
        " \"single\": [{\"SpecialToken\": {\"id\": \"<s>\"}}], \"special_tokens\": {\"<s>\": {\"ids\": [0]}}}}",
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}}, \"pre_tokenizer\": {\"type\": \"ByteLevel\"},"
        " \"decoder\": {\"type\": \"ByteLevel\"}, \"post_processor\": {\"type\": \"TemplateProcessing\","
        " \"single\": [{\"SpecialToken\": {\"id\": \"<s>\"}}, {\"Sequence\": {\"id\": \"A\"}}],"
        " \"special_tokens\": {\"<s>\": {\"ids\": [99]}}}}",
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"unk_token\": \"<unk>\"},"
        " \"pre_tokenizer\": {\"type\": \"ByteLevel\"}, \"decoder\": {\"type\": \"ByteLevel\"}}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char err[ERR_BUF] = "";
        struct tokenizer *t = (struct tokenizer *)1;
        int rc = tok_load_hf_json_buf(bad[i], strlen(bad[i]), &t, err, sizeof err);
        CHECK(rc < 0, "case %zu accepted: %s", i, bad[i]);
        CHECK(t == NULL, "case %zu: out not cleared", i);
        CHECK(strlen(err) > 10 && strstr(err, "tokenizer.json"), "case %zu: no message (%s)", i, err);
    }
    char err[ERR_BUF];
    struct tokenizer *t;
    CHECK(tok_load_hf_json("/nonexistent/tokenizer.json", &t, err, sizeof err) == ERR_IO && strstr(err, "nonexistent"),
          "missing file: %s", err);
}

/* Truncations of a valid file are refused cleanly (or load, if the cut is harmless). */
static void test_truncated_json(void)
{
    const char *good =
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2}, \"merges\": [\"a b\"]},"
        " \"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false},"
        " \"decoder\": {\"type\": \"ByteLevel\"}}";
    size_t n = strlen(good);
    for (size_t k = 0; k < n; k++) {
        char err[ERR_BUF];
        struct tokenizer *t = NULL;
        int rc = tok_load_hf_json_buf(good, k, &t, err, sizeof err);
        CHECK(rc < 0 && t == NULL, "truncated at %zu accepted", k);
    }
    char err[ERR_BUF];
    struct tokenizer *t = NULL;
    CHECK(tok_load_hf_json_buf(good, n, &t, err, sizeof err) == 0, "full: %s", err);
    tok_free(t);
}

static void test_regex_rewrite_semantics(void)
{
    /* Split(\s, Removed) over the full byte vocabulary: whitespace vanishes, anything
     * else stays as byte tokens. \s follows Oniguruma: U+3000 yes, U+180E no. */
    char err[ERR_BUF];
    struct tokenizer *t = load_bytes(
        "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"pattern\": {\"Regex\": \"\\\\s\"},"
        " \"behavior\": \"Removed\"}, {\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": false}]}",
        err);
    CHECK(t, "load: %s", err);
    if (!t)
        return;
    int32_t ids[64];
    int n = enc(t, "a a\xe3\x80\x80" "a\xc2\x85" "a", ids, 64);
    CHECK(n == 4, "space, U+3000, U+0085 removed: n=%d", n);
    n = enc(t, "a\xe1\xa0\x8e" "a", ids, 64);
    CHECK(n == 5, "U+180E is not whitespace: n=%d", n);
    tok_free(t);
    /* \p{L} includes a Unicode 16 letter (U+105C0 Todhri), \p{N} a Unicode 16 digit */
    t = load_bytes("{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"pattern\": {\"Regex\":"
                   " \"[\\\\p{L}\\\\p{N}]\"}, \"behavior\": \"Removed\"}, {\"type\": \"ByteLevel\","
                   " \"add_prefix_space\": false, \"use_regex\": false}]}",
                   err);
    CHECK(t, "load: %s", err);
    if (!t)
        return;
    n = enc(t, "\xf0\x90\x97\x80-\xf0\x9f\xaf\xb0", ids, 64);
    CHECK(n == 1 && ids[0] == '-', "U+105C0 and U+1FBF0 removed: n=%d", n);
    tok_free(t);
}

struct thread_arg {
    const struct tokenizer *t;
    const char *text;
    int32_t ids[4096];
    int n;
};

static void *encode_thread(void *p)
{
    struct thread_arg *a = p;
    for (int i = 0; i < 20; i++)
        a->n = tok_encode(a->t, a->text, strlen(a->text), true, true, a->ids, 4096);
    return NULL;
}

static void test_real_tokenizers(void)
{
    const char *path = test_data_path("tokenizers/qwen3/tokenizer.json");
    char err[ERR_BUF];
    struct tokenizer *t = NULL;
    CHECK(tok_load_hf_json(path, &t, err, sizeof err) == 0, "qwen3 (from scripts/get-testdata.py): %s", err);
    if (!t)
        return;
    int32_t ids[64];
    int n = enc(t, "Hello world", ids, 64);
    CHECK(n == 2 && ids[0] == 9707 && ids[1] == 1879, "qwen3 Hello world: n=%d", n);
    n = enc(t, "<|im_start|>user", ids, 64);
    CHECK(n == 2 && ids[0] == 151644 && ids[1] == 872, "qwen3 special");
    CHECK(tok_vocab_size(t) == 151669, "qwen3 vocab %d", tok_vocab_size(t));
    /* the same results from several threads at once */
    struct thread_arg args[4];
    pthread_t th[4];
    const char *text = "The quick brown fox 你好 😀 <|im_end|> 12345";
    for (int i = 0; i < 4; i++) {
        args[i].t = t;
        args[i].text = text;
        pthread_create(&th[i], NULL, encode_thread, &args[i]);
    }
    for (int i = 0; i < 4; i++)
        pthread_join(th[i], NULL);
    for (int i = 1; i < 4; i++)
        CHECK(args[i].n == args[0].n && memcmp(args[i].ids, args[0].ids, sizeof(int32_t) * (size_t)args[0].n) == 0,
              "thread %d differs", i);
    tok_free(t);
}

static void test_gguf_smollm(void)
{
    const char *path = test_path("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    struct mapped_file mf;
    char err[ERR_BUF];
    if (map_open(path, &mf, err, sizeof err) < 0) {
        CHECK(0, "%s (make model provides it)", err);
        return;
    }
    struct gguf_file *g = NULL;
    struct tokenizer *t = NULL;
    CHECK(gguf_parse(mf.data, mf.size, path, &g, err, sizeof err) == 0, "gguf: %s", err);
    if (g)
        CHECK(tok_load_gguf(g, &t, err, sizeof err) == 0, "tok: %s", err);
    gguf_free(g);
    map_close(&mf);
    if (!t)
        return;
    CHECK(tok_vocab_size(t) == 49152, "vocab %d", tok_vocab_size(t));
    CHECK(tok_bos_id(t) == 1 && tok_eos_id(t) == 2 && !tok_adds_bos(t), "bos/eos %d %d", tok_bos_id(t), tok_eos_id(t));
    int32_t ids[64];
    int n = enc(t, "Hello world 12345", ids, 64);
    static const int32_t want[] = { 19556, 905, 216, 33, 34, 35, 36, 37 };
    CHECK(n == 8 && memcmp(ids, want, sizeof want) == 0, "smollm ids, n=%d", n);
    CHECK(tok_is_special(t, 1) && tok_find(t, "<|im_start|>") == 1, "control tokens are special");
    tok_free(t);
}

/* A SentencePiece-style tokenizer.json: characters, byte fallback for "é", unk fused. */
static struct tokenizer *load_spm(const char *normalizer, const char *pre, char *err)
{
    char json[4096];
    snprintf(json, sizeof json,
             "{\"model\": {\"type\": \"BPE\", \"unk_token\": \"<unk>\", \"fuse_unk\": true, \"byte_fallback\": true,"
             " \"vocab\": {\"<unk>\": 0, \"\u2581\": 1, \"a\": 2, \"b\": 3, \"\u2581a\": 4, \"ab\": 5,"
             " \"\u2581ab\": 6, \"<0xC3>\": 7, \"<0xA9>\": 8, \"<s>\": 9},"
             " \"merges\": [\"\u2581 a\", \"a b\", \"\u2581a b\"]},"
             " \"added_tokens\": [{\"id\": 9, \"content\": \"<s>\", \"special\": true}],"
             " \"normalizer\": %s, \"pre_tokenizer\": %s,"
             " \"decoder\": {\"type\": \"Sequence\", \"decoders\": [{\"type\": \"Replace\", \"pattern\":"
             " {\"String\": \"\u2581\"}, \"content\": \" \"}, {\"type\": \"ByteFallback\"}, {\"type\": \"Fuse\"},"
             " {\"type\": \"Strip\", \"content\": \" \", \"start\": 1, \"stop\": 0}]}}",
             normalizer, pre);
    struct tokenizer *t = NULL;
    return tok_load_hf_json_buf(json, strlen(json), &t, err, ERR_BUF) < 0 ? NULL : t;
}

static void test_sentencepiece_bpe(void)
{
    char err[ERR_BUF];
    int32_t ids[16];
    /* legacy Llama: Prepend("▁") + Replace(" ", "▁") on every segment */
    struct tokenizer *t = load_spm("{\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"Prepend\", \"prepend\":"
                                   " \"\u2581\"}, {\"type\": \"Replace\", \"pattern\": {\"String\": \" \"}, \"content\":"
                                   " \"\u2581\"}]}", "null", err);
    CHECK(t, "load: %s", err);
    if (t) {
        CHECK(enc(t, "ab", ids, 16) == 1 && ids[0] == 6, "ab -> [\u2581ab]");
        int n = enc(t, "ab \xc3\xa9", ids, 16);
        CHECK(n == 4 && ids[0] == 6 && ids[1] == 1 && ids[2] == 7 && ids[3] == 8, "byte fallback, n=%d", n);
        n = enc(t, "zz\xe2\x82\xac" "b", ids, 16);
        CHECK(n == 3 && ids[0] == 1 && ids[1] == 0 && ids[2] == 3, "unknown characters fuse into one unk, n=%d", n);
        n = enc(t, "<s>ab", ids, 16);
        CHECK(n == 2 && ids[0] == 9 && ids[1] == 6, "the segment after an added token is prefixed too, n=%d", n);
        static const int32_t dec[] = { 6, 1, 7, 8 };
        char *d = tok_decode(t, dec, 4, false);
        CHECK(d && strcmp(d, "ab \xc3\xa9") == 0, "decode strips one leading space: '%s'", d ? d : "");
        free(d);
        char b[8];
        CHECK(tok_token_bytes(t, 6, false, b, 8) == 3 && memcmp(b, " ab", 3) == 0, "token bytes keep the space");
        CHECK(tok_token_bytes(t, 7, false, b, 8) == 1 && (uint8_t)b[0] == 0xC3, "<0xC3> is one byte");
        tok_free(t);
    }
    /* Metaspace prepend_scheme "first": no prefix after an added token, none doubled */
    t = load_spm("null", "{\"type\": \"Metaspace\", \"replacement\": \"\u2581\", \"prepend_scheme\": \"first\","
                 " \"split\": false}", err);
    CHECK(t, "load: %s", err);
    if (t) {
        CHECK(enc(t, "ab", ids, 16) == 1 && ids[0] == 6, "ab -> [\u2581ab]");
        CHECK(enc(t, " ab", ids, 16) == 1 && ids[0] == 6, "' ab' -> [\u2581ab]");
        int n = enc(t, "<s>ab", ids, 16);
        CHECK(n == 2 && ids[0] == 9 && ids[1] == 5, "no prefix after <s>, n=%d", n);
        tok_free(t);
    }
}

/* Loads a GGUF file's tokenizer (NULL and a failed check if it cannot). */
static struct tokenizer *load_gguf_path(const char *path)
{
    struct mapped_file mf;
    char err[ERR_BUF];
    if (map_open(path, &mf, err, sizeof err) < 0) {
        CHECK(0, "%s (scripts/get-testdata.py provides it)", err);
        return NULL;
    }
    struct gguf_file *g = NULL;
    struct tokenizer *t = NULL;
    CHECK(gguf_parse(mf.data, mf.size, path, &g, err, sizeof err) == 0, "gguf: %s", err);
    if (g)
        CHECK(tok_load_gguf(g, &t, err, sizeof err) == 0, "%s: %s", path, err);
    gguf_free(g);
    map_close(&mf);
    return t;
}

/* A few of Hugging Face's ids (llama.cpp's .out vectors) on llama.cpp's GGUF vocabularies. */
static void test_gguf_vocabs(void)
{
    static const struct {
        const char *name, *text;
        int n;
        int32_t ids[12];
    } cases[] = {
        /* Llama 3's ignore_merges: " Việt" is one token though no merge path leads to it */
        { "llama-bpe", "C\xe1\xbb\xad" "a Vi\xe1\xbb\x87t", 3, { 34, 91163, 101798 } },
        /* Falcon: digits split on the byte alphabet after ByteLevel ('\xbd' of "½" is one) */
        { "falcon", "ied 4 \xc2\xbd months 1234567", 10, { 878, 204, 31, 3068, 133, 2137, 204, 10963, 27681, 34 } },
        /* Qwen3.5: no normalizer, combining marks stay separate tokens */
        { "qwen35", "re\xcc\x81sume\xcc\x81", 4, { 265, 53839, 31323, 53839 } },
        /* MPT and Command-R: NFC first */
        { "mpt", "Ve\xcc\x81", 2, { 55, 860 } },
        { "command-r", "Ve\xcc\x81", 2, { 61, 1751 } },
        /* Llama 2 (SentencePiece): dummy prefix, byte fallback for the emoji */
        { "llama-spm", " Hello\n\n \xf0\x9f\xa6\x99 Vi\xe1\xbb\x87t", 12,
          { 29871, 15043, 13, 13, 29871, 243, 162, 169, 156, 10630, 30529, 29873 } },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char rel[128];
        snprintf(rel, sizeof rel, "vocab/ggml-vocab-%s.gguf", cases[i].name);
        struct tokenizer *t = load_gguf_path(test_data_path(rel));
        if (!t)
            continue;
        int32_t ids[32];
        int n = enc(t, cases[i].text, ids, 32);
        CHECK(n == cases[i].n && memcmp(ids, cases[i].ids, sizeof(int32_t) * (size_t)n) == 0,
              "%s: %d ids, first %d (want %d, first %d)", cases[i].name, n, n > 0 ? ids[0] : -1, cases[i].n,
              cases[i].ids[0]);
        char *d = tok_decode(t, ids, n > 32 ? 32 : n, false);
        bool nfd = strstr(cases[i].text, "\xcc\x81") != NULL && strcmp(cases[i].name, "qwen35") != 0;
        CHECK(d && (nfd || strcmp(d, cases[i].text) == 0), "%s: decode gave '%s'", cases[i].name, d ? d : "");
        free(d);
        tok_free(t);
    }
}

int main(void)
{
    RUN(test_byte_alphabet);
    RUN(test_utf8_validation);
    RUN(test_bpe_merge_order);
    RUN(test_ignore_merges_and_added);
    RUN(test_stream_decoder);
    RUN(test_malformed_json);
    RUN(test_truncated_json);
    RUN(test_regex_rewrite_semantics);
    RUN(test_real_tokenizers);
    RUN(test_gguf_smollm);
    RUN(test_sentencepiece_bpe);
    RUN(test_gguf_vocabs);
    return test_summary();
}
