/* examples/embed_bert_tiny.c — a program that embeds hpc through its C API
 * (include/hpc.h): it opens BERT-tiny on the cpu backend, tokenizes a few
 * sentences with hpc's WordPiece tokenizer, classifies them, fine-tunes a
 * few steps on them, classifies again, saves the weights, and checks that a
 * second handle loaded from the saved file gives the same logits.
 *
 * Usage (from the repository root, after `make` and `make -C examples`):
 *   examples/embed_bert_tiny [MODEL [VOCAB [OUT.safetensors [STEPS]]]]
 * defaults: models/bert_tiny.model data/vocab/bert-base-uncased-vocab.txt
 *           /tmp/embed_bert_tiny.safetensors 30
 * Exits 0 on success, else the HpcApiStatus of the failing call. */
#include <stdio.h>
#include <string.h>

#include "hpc.h"
#include "data/tokenizer.h"  /* runtime/data/tokenizer.h: WordPiece, identical to Hugging Face's */

#define N_SENT 8
#define MAX_LEN 16
#define STEPS 30  /* default; the 4th argument overrides */

static int steps = STEPS;

/* A toy sentiment task: 1 = positive, 0 = negative. */
static const char *const sentences[N_SENT] = {
    "What a wonderful, sunny morning!", "The film was dull and far too long.",
    "I really enjoyed the concert.",    "This soup tastes awful.",
    "She gave a brilliant talk.",       "The service was slow and rude.",
    "Our trip was a delight.",          "I hated every minute of it.",
};
static const int32_t labels[N_SENT] = {1, 0, 1, 0, 1, 0, 1, 0};

typedef struct {
    int32_t ids[N_SENT * MAX_LEN];   /* (B, L) */
    int32_t types[N_SENT * MAX_LEN]; /* (B, L) */
    int32_t mask[N_SENT * MAX_LEN];  /* (B, L) */
} Encoded;

/* Tokenizes every sentence to [CLS] ... [SEP], padded to MAX_LEN. */
static int encode_all(const char *vocab, Encoded *e)
{
    HpcError err = {0};
    Tokenizer *tok;
    if (tokenizer_load(vocab, true, &tok, &err)) {
        fprintf(stderr, "embed_bert_tiny: %s\n", err.msg);
        return err.code;
    }
    TokEncoding enc = {0};
    memset(e, 0, sizeof *e);
    for (int i = 0; i < N_SENT; i++) {
        if (tokenizer_encode(tok, sentences[i], NULL, MAX_LEN, &enc, &err)) {
            fprintf(stderr, "embed_bert_tiny: %s\n", err.msg);
            break;
        }
        for (int t = 0; t < enc.len; t++) {
            e->ids[i * MAX_LEN + t] = enc.ids[t];
            e->types[i * MAX_LEN + t] = enc.type_ids[t];
            e->mask[i * MAX_LEN + t] = 1;
        }
        for (int t = enc.len; t < MAX_LEN; t++) e->ids[i * MAX_LEN + t] = tokenizer_pad_id(tok);
    }
    tok_encoding_free(&enc);
    tokenizer_free(tok);
    return err.code == HPC_OK ? 0 : err.code;
}

static HpcModel *open_model(const char *path)
{
    HpcModelOptions o;
    hpc_model_options_init(&o);
    o.path = path;
    o.backend = HPC_BACKEND_CPU;
    o.max_batch = N_SENT;
    o.max_seq_len = MAX_LEN;
    o.total_steps = steps;
    HpcModel *m;
    char msg[1024];
    if (hpc_model_open(&o, &m, msg, sizeof msg)) {
        fprintf(stderr, "embed_bert_tiny: %s\n", msg);
        return NULL;
    }
    return m;
}

static int fail(HpcModel *m, HpcApiStatus st)
{
    fprintf(stderr, "embed_bert_tiny: %s\n", hpc_model_error(m));
    return (int)st;
}

static void print_predictions(const char *title, const float *logits)
{
    printf("%s\n", title);
    for (int i = 0; i < N_SENT; i++) {
        int pred = logits[2 * i + 1] > logits[2 * i];
        printf("  %-8s (logits %+.3f %+.3f, label %s)  %s\n", pred ? "positive" : "negative",
               logits[2 * i], logits[2 * i + 1], labels[i] ? "positive" : "negative", sentences[i]);
    }
}

/* Fine-tunes on the sentences, saves, returns the trained logits. */
static int train_and_save(HpcModel *m, const HpcBatch *b, const char *out, float *logits)
{
    HpcApiStatus st;
    for (int s = 0; s < steps; s++) {
        HpcStepReport r;
        if ((st = hpc_model_train_step(m, b, &r))) return fail(m, st);
        printf("step %d  loss %.4f  lr %.2e  grad norm %.3f%s\n", (int)r.step, r.loss, r.lr, r.grad_norm,
               r.skipped ? "  (skipped)" : "");
    }
    double loss;
    if ((st = hpc_model_evaluate(m, b, &loss, logits, N_SENT * 2))) return fail(m, st);
    printf("eval loss after %d steps: %.4f\n", steps, loss);
    if ((st = hpc_model_save_weights(m, out))) return fail(m, st);
    printf("saved %s\n", out);
    return 0;
}

/* A second handle loads the file and must give the same logits. */
static int check_reload(const char *model, const char *out, const HpcBatch *b, const float *want)
{
    HpcModel *m2 = open_model(model);
    if (!m2) return HPC_API_ERR_INPUT;
    float got[N_SENT * 2];
    HpcApiStatus st = hpc_model_load_weights(m2, out);
    if (!st) st = hpc_model_forward(m2, b, got, N_SENT * 2);
    int rc = st ? fail(m2, st) : 0;
    for (int i = 0; !rc && i < N_SENT * 2; i++)
        if (got[i] != want[i]) {
            fprintf(stderr, "embed_bert_tiny: reloaded logit %d is %g, trained %g\n", i, got[i], want[i]);
            rc = HPC_API_ERR_INTERNAL;
        }
    if (!rc) printf("reloaded %s: same logits\n", out);
    hpc_model_free(m2);
    return rc;
}

int main(int argc, char **argv)
{
    const char *model = argc > 1 ? argv[1] : "models/bert_tiny.model";
    const char *vocab = argc > 2 ? argv[2] : "data/vocab/bert-base-uncased-vocab.txt";
    const char *out = argc > 3 ? argv[3] : "/tmp/embed_bert_tiny.safetensors";
    if (argc > 4 && sscanf(argv[4], "%d", &steps) != 1) steps = -1;
    if (steps < 1 || steps > 100000) {
        fprintf(stderr, "embed_bert_tiny: STEPS must be a number from 1 to 100000\n");
        return HPC_API_ERR_USAGE;
    }
    static Encoded e;
    int rc = encode_all(vocab, &e);
    if (rc) return rc;
    HpcModel *m = open_model(model);
    if (!m) return HPC_API_ERR_INPUT;
    HpcModelInfo info;
    hpc_model_info(m, &info);
    printf("%s on %s: %lld parameters, hidden %lld, %lld labels (hpc API %u.%u)\n", info.name, info.backend,
           (long long)info.n_params, (long long)info.hidden, (long long)info.num_labels,
           hpc_api_version() >> 16, hpc_api_version() & 0xffff);

    HpcBatch b = {.batch = N_SENT, .seq_len = MAX_LEN, .input_ids = e.ids, .attention_mask = e.mask,
                  .token_type_ids = e.types, .labels = labels};
    float logits[N_SENT * 2];  /* (B, 2) f32 */
    HpcApiStatus st = hpc_model_forward(m, &b, logits, N_SENT * 2);
    if (st) rc = fail(m, st);
    if (!rc) print_predictions("before fine-tuning (random classifier):", logits);
    if (!rc) rc = train_and_save(m, &b, out, logits);
    if (!rc) print_predictions("after fine-tuning:", logits);
    hpc_model_free(m);
    if (!rc) rc = check_reload(model, out, &b, logits);
    return rc;
}
