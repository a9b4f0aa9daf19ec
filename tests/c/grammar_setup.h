/* grammar_setup.h — what the grammar tests share: the default model's tokenizer (SmolLM2,
 * vocab 49152; TESSERA_TEST_MODEL picks another GGUF) and its grammar vocabulary, with the
 * end-of-generation ids (eos, and <|im_end|> when the model has one). */
#ifndef TESSERA_TESTS_GRAMMAR_SETUP_H
#define TESSERA_TESTS_GRAMMAR_SETUP_H

#include "grammar/grammar.h"
#include "loader/gguf.h"
#include "test.h"
#include "tokenizer/tokenizer.h"
#include "util/err.h"
#include "util/mapfile.h"

/* Fills *tok, *vocab, eog[0, *n_eog); false (with the reason on stderr) when the model
 * cannot be read. The caller frees both. */
static bool grammar_test_setup(struct tokenizer **tok, struct grammar_vocab **vocab, int32_t eog[2], int *n_eog)
{
    const char *rel = getenv("TESSERA_TEST_MODEL") ? getenv("TESSERA_TEST_MODEL")
                                                   : "models/SmolLM2-135M-Instruct.Q4_1.gguf";
    const char *path = test_path(rel);
    struct mapped_file mf;
    char err[ERR_BUF];
    if (map_open(path, &mf, err, sizeof err) < 0) {
        fprintf(stderr, "%s (make model provides it)\n", err);
        return false;
    }
    struct gguf_file *g = NULL;
    int rc = gguf_parse(mf.data, mf.size, path, &g, err, sizeof err);
    if (!rc)
        rc = tok_load_gguf(g, tok, err, sizeof err);
    gguf_free(g);
    map_close(&mf);
    if (rc) {
        fprintf(stderr, "%s: %s\n", path, err);
        return false;
    }
    *n_eog = 0;
    eog[(*n_eog)++] = tok_eos_id(*tok);
    int im_end = tok_find(*tok, "<|im_end|>");
    if (im_end >= 0 && im_end != eog[0])
        eog[(*n_eog)++] = im_end;
    if (grammar_vocab_create(vocab, *tok, eog, *n_eog, err, sizeof err)) {
        fprintf(stderr, "vocab: %s\n", err);
        return false;
    }
    return true;
}

#endif
