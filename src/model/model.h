/* model.h — a loaded model: mapped files, config, weights, tokenizer, chat template,
 * special tokens and generation defaults.
 *
 * model_load detects a GGUF file or a Hugging Face directory and owns everything it
 * opens; the weights are views into the mappings. A loaded model is immutable and may
 * be shared by threads (the forward's mutable state is struct forward_state).
 */
#ifndef TESSERA_MODEL_MODEL_H
#define TESSERA_MODEL_MODEL_H

#include "model/config.h"
#include "model/weights.h"
#include "util/mapfile.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct gguf_file;
struct hf_dir;
struct tokenizer;
struct jinja_template;
struct dummy_weights;
struct converted_weights;

enum model_source { MODEL_GGUF = 0, MODEL_HF = 1 };

#define MODEL_MAX_EOG 16

/* Sampling defaults from generation_config.json (< 0 / -1 when absent). */
struct gen_defaults {
    double temperature;
    double top_p;
    int top_k;
    double repetition_penalty;
};

struct model {
    char *path;                     /* as given to model_load */
    char name[128];                 /* display name: general.name or the directory name */
    enum model_source source;
    struct mapped_file map;         /* GGUF mapping (MODEL_GGUF) */
    struct gguf_file *gguf;         /* MODEL_GGUF */
    struct hf_dir *hf;              /* MODEL_HF */
    struct model_config cfg;
    struct model_weights w;
    struct tokenizer *tok;          /* NULL with MODEL_LOAD_NO_TOKENIZER */
    char *chat_template;            /* template source (owned copy), NULL if none */
    struct jinja_template *tmpl;    /* parsed chat_template, NULL if none */
    char *bos_token;                /* token strings for the template context, NULL if none */
    char *eos_token;
    int32_t eog_ids[MODEL_MAX_EOG]; /* ids that end generation (eos + known end-of-turn tokens) */
    int n_eog;
    struct gen_defaults gen;
    struct dummy_weights *dummy;    /* MODEL_LOAD_DUMMY: the random weights (owned; freed once a
                                       conversion has replaced every matrix) */
    bool random_weights;            /* MODEL_LOAD_DUMMY */
    struct converted_weights *converted; /* MODEL_LOAD_Q8_0 / _F16 / _BF16: the converted matrices
                                            w points at (owned), else NULL */
};

/* Flags for model_load. */
enum {
    MODEL_LOAD_NO_TOKENIZER = 1 << 0, /* skip tokenizer and chat template (logits tests) */
    MODEL_LOAD_DUMMY = 1 << 1,        /* --load-format dummy: an HF directory's config.json (and
                                         tokenizer files) with random weights of the real
                                         shapes (model/dummy.h); safetensors are not read */
    MODEL_LOAD_Q8_0 = 1 << 2,         /* --quantization q8_0: F32/F16/BF16 matrices quantized
                                         to Q8_0 at load (model/weights_convert.h) */
    MODEL_LOAD_F16 = 1 << 3,          /* --dtype float16: F32/BF16 matrices to F16 at load */
    MODEL_LOAD_BF16 = 1 << 4,         /* --dtype bfloat16: F32/F16 matrices to BF16 at load
                                         (MODEL_LOAD_Q8_0 wins over both) */
};

/* The model_load flags of a --quantization name (none, q8_0) and a --dtype name (auto,
 * bfloat16, float16, half; vLLM's spellings), added to *flags (the conversion flags it
 * held are replaced). NULL: that option not given. Returns 0, or -1 for an unknown name
 * (*flags unchanged). Shared by `serve`'s option table and the other subcommands' flags. */
int model_convert_flags(const char *quantization, const char *dtype, unsigned *flags);

/* Loads path: a .gguf file or an HF directory. On error returns a negative code with a
 * message naming the file and key/tensor, and *out = NULL. Called once at start-up. */
int model_load(const char *path, unsigned flags, struct model **out, char *err, size_t errlen);
void model_free(struct model *m);

/* Frees the host copy of the matrices converted at load (--quantization, --dtype) once a
 * backend holds its own copy of every weight (the CUDA backend after create); their views
 * keep their shapes but no data. Returns the bytes freed (0: nothing converted). Only for
 * a model nothing on the host computes with afterwards (tessera serve on a GPU). */
size_t model_release_converted(struct model *m);
/* The same for a model the CPU backend serves: the converted bytes of the matrices its
 * forward state packed (it reads only the packed copy) are handed back to the kernel,
 * all but the token embedding's (converted_weights_release_packed). Returns the bytes
 * handed back. Only once the one CPU backend of this model exists, and when no other
 * backend or forward state will be made from the model (tessera serve on the CPU). */
size_t model_release_converted_packed(struct model *m);

/* True if id ends a generation (in eog_ids). */
bool model_is_eog(const struct model *m, int32_t id);

/* One-line summary ("llama 30 layers dim 576 heads 9/3 ...") into buf; MODEL_DESC_MAX
 * bytes hold the longest. */
#define MODEL_DESC_MAX 640
void model_describe(const struct model *m, char *buf, size_t len);

#endif
