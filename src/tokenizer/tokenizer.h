/* tokenizer.h — BPE tokenizer, byte-level (GPT-2 style: Llama 3, Qwen2/2.5/3, SmolLM2,
 * DeepSeek, Falcon, MPT) or SentencePiece-style with byte fallback (Llama 2, Mistral,
 * Phi-3, Gemma), loaded from a Hugging Face tokenizer.json or from GGUF metadata.
 *
 * Encoding follows Hugging Face `tokenizers` exactly: added/special tokens are matched
 * in the text first (never split), the normalizer runs, the pre-tokenizer splits the
 * rest (full Unicode categories), bytes map to the GPT-2 byte alphabet (or characters
 * to vocab entries, else to <0xXX> byte tokens) and BPE merges apply by rank. A struct
 * tokenizer is immutable after creation and may be used from any thread; per-call state
 * lives in the caller.
 */
#ifndef TESSERA_TOKENIZER_H
#define TESSERA_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct tokenizer;
struct gguf_file;

/* Loads tokenizer.json (path to the file). */
int tok_load_hf_json(const char *path, struct tokenizer **out, char *err, size_t errlen);
/* Same, from an in-memory JSON text (for fuzzing and tests). */
int tok_load_hf_json_buf(const char *json, size_t len, struct tokenizer **out, char *err, size_t errlen);
/* Loads tokenizer.ggml.* from a parsed GGUF file (model "gpt2" with its "pre" variant, or
 * "llama", SentencePiece BPE from scores). The tokenizer copies what it needs: g may be
 * freed afterwards. */
int tok_load_gguf(const struct gguf_file *g, struct tokenizer **out, char *err, size_t errlen);
/* Applies a tokenizer_config.json to a loaded tokenizer, as transformers does: bos_token
 * and eos_token (string or AddedToken object) set tok_bos_id/tok_eos_id; add_bos_token
 * and add_eos_token, when present, replace what the post-processor adds. */
int tok_apply_hf_config(struct tokenizer *t, const char *path, char *err, size_t errlen);
/* dir/tokenizer.json, then dir/tokenizer_config.json if present (tok_apply_hf_config). */
int tok_load_hf_dir(const char *dir, struct tokenizer **out, char *err, size_t errlen);
/* Frees t and everything it owns (NULL is fine). No encode may be running on t. */
void tok_free(struct tokenizer *t);

int tok_vocab_size(const struct tokenizer *t);
/* -1 when the tokenizer has none. BOS: GGUF bos_token_id; for tokenizer.json the first
 * token the post-processor prepends, else a special added token with a well-known BOS
 * name (<|begin_of_text|>, <｜begin▁of▁sentence｜>, <s>, <bos>, <|startoftext|>), else
 * tokenizer_config.json's bos_token via tok_apply_hf_config. EOS: GGUF eos_token_id or
 * tok_apply_hf_config only. */
int tok_bos_id(const struct tokenizer *t);
int tok_eos_id(const struct tokenizer *t);
/* Whether encode with add_special=true prepends BOS (tokenizer.json post-processor /
 * tokenizer_config add_bos_token / tokenizer.ggml.add_bos_token). */
bool tok_adds_bos(const struct tokenizer *t);
/* on: encode(add_special) prepends exactly BOS (nothing if there is no BOS id); off:
 * nothing is prepended. Call before sharing t between threads. */
void tok_set_adds_bos(struct tokenizer *t, bool on);
/* Id of an exact token string (added or regular vocab, in its stored form), or -1. */
int tok_find(const struct tokenizer *t, const char *piece);
/* True for added tokens flagged special / GGUF CONTROL tokens. */
bool tok_is_special(const struct tokenizer *t, int id);

/* Encodes len bytes of text (UTF-8; invalid bytes are encoded as their byte tokens).
 * add_special: apply the post-processor (BOS). parse_special: match special added
 * tokens in the text (true for chat-template output; false for untrusted user text in
 * the completions API, where "<|im_start|>" must be plain text). parse_special=false is
 * HF's split_special_tokens=True: special added tokens are left to the pre-tokenizer and
 * BPE, non-special added tokens (e.g. Qwen's <tool_call>) are still matched.
 * Writes up to cap ids to ids and returns the total count (which may exceed cap: call
 * again with a bigger buffer), or a negative ERR_* code. */
int tok_encode(const struct tokenizer *t, const char *text, size_t len, bool add_special,
               bool parse_special, int32_t *ids, int cap);

/* The bytes of one token as they appear in decoded text (GPT-2 byte alphabet undone;
 * SentencePiece-style: "▁" as a space, <0xXX> as its byte). Returns the token's full
 * byte length and writes min(length, cap) bytes to buf (no NUL). Special tokens decode
 * to their text unless skip_special (then length 0). */
int tok_token_bytes(const struct tokenizer *t, int id, bool skip_special, char *buf, int cap);

/* Decodes ids to a malloc'd NUL-terminated string (caller frees), as HF's decode of the
 * whole sequence: SentencePiece-style decoders drop the leading space (Strip) or the
 * first token's "▁" (Metaspace), which tok_token_bytes and the stream decoder keep.
 * Invalid UTF-8 byte sequences are kept as is (callers that need valid UTF-8 use the
 * stream decoder). */
char *tok_decode(const struct tokenizer *t, const int32_t *ids, int n, bool skip_special);

/* Incremental detokenizer for streaming: feed one id at a time; out receives only
 * complete UTF-8 characters (a partial multi-byte character is held until its
 * continuation arrives; a byte that cannot start or continue a valid character becomes
 * U+FFFD, so out is always valid UTF-8). Caller-owned state, no allocation. */
struct tok_stream {
    char pending[8]; /* bytes of an incomplete UTF-8 character */
    int n_pending;
};
void tok_stream_init(struct tok_stream *s);
/* Writes the text completed by token id to out (at most cap bytes including the NUL)
 * and returns the byte count; returns ERR_RANGE (state unchanged) if cap is too small
 * or id is out of range. cap >= 3 * (token length) + 4 always suffices
 * (an invalid byte widens to U+FFFD). */
int tok_stream_feed(const struct tokenizer *t, struct tok_stream *s, int id, bool skip_special,
                    char *out, int cap);
/* Flushes held bytes at end of stream (an incomplete trailing character becomes U+FFFD). */
int tok_stream_flush(struct tok_stream *s, char *out, int cap);

#endif
