/* reasoning.h — splits a chat answer into its reasoning part (between <think> and
 * </think>) and its content, as vLLM's reasoning parsers deepseek_r1 and qwen3 do.
 *
 * The splitter is fed the generated text delta by delta and calls back with pieces,
 * each marked reasoning or content, holding back only the bytes that may still become a
 * tag (at most 8). It allocates nothing. One splitter per choice; one thread at a time.
 *
 * Rules:
 *   - At the start of the output a "<think>" tag opens the reasoning (the tag is dropped).
 *   - deepseek_r1, or any kind when the prompt already opened "<think>": the output starts
 *     inside the reasoning, so with neither tag everything is reasoning (R1-Distill's
 *     template ends the prompt with "<think>\n").
 *   - qwen3 with a prompt that did not open it: output not starting with "<think>" is all
 *     content (enable_thinking=false renders an empty think block into the prompt).
 *   - "</think>" ends the reasoning (the tag is dropped); everything after is content.
 */
#ifndef TESSERA_API_REASONING_H
#define TESSERA_API_REASONING_H

#include <stdbool.h>
#include <stddef.h>

enum rsn_kind { RSN_NONE = 0, RSN_DEEPSEEK_R1, RSN_QWEN3 };

/* "deepseek_r1" / "qwen3" / "none" → the kind, or -1 for an unknown name. */
int rsn_kind_from_name(const char *name);
/* The kind's name ("none" for RSN_NONE). */
const char *rsn_kind_name(enum rsn_kind k);

/* True if the prompt text s[0, len) ends, trailing whitespace aside, with "<think>": the
 * template opened the reasoning for the model. */
bool rsn_prompt_opens(const char *s, size_t len);

/* Receives one piece of the split (never empty). Returns 0, or a negative code that the
 * feed returns at once. */
typedef int (*rsn_out_fn)(void *ud, bool reasoning, const char *s, size_t len);

struct rsn_split {
    enum rsn_kind kind;
    int state;          /* internal: at the start, inside the reasoning, in the content */
    bool default_in;    /* without an opening tag the output starts inside the reasoning */
    char hold[16];      /* [n_hold] bytes that may be the start of a tag */
    size_t n_hold;
};

/* Starts a splitter. kind RSN_NONE passes everything through as content. opened: the
 * prompt already opened the reasoning (rsn_prompt_opens). */
void rsn_init(struct rsn_split *r, enum rsn_kind kind, bool opened);
/* Feeds s[0, len); out is called for what can be decided now. Returns 0 or out's error. */
int rsn_feed(struct rsn_split *r, const char *s, size_t len, rsn_out_fn out, void *ud);
/* The end of the output: releases held bytes in the current part. */
int rsn_flush(struct rsn_split *r, rsn_out_fn out, void *ud);
/* True while the output is inside the reasoning (at its start: when it starts there
 * without an opening tag), for counting reasoning tokens: a caller counts a delta's
 * tokens as reasoning when this is true before or after feeding it. */
bool rsn_in_reasoning(const struct rsn_split *r);

#endif
