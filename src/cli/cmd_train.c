/* `bertqat finetune`: fp32 fine-tuning of a Hugging Face BERT (or a native checkpoint) for sequence
 * classification or, with a question-answering model or --task qa, for SQuAD question answering
 * (src/qa.h), HF Trainer semantics (see src/train.h). Defaults follow HF TrainingArguments where
 * they exist (lr 5e-5, 1 epoch, warmup 0, weight decay 0, max_grad_norm 1.0, seed 42) and the ONNX
 * Runtime IMDB example otherwise (batch 32, seq 128, 10% of the training reviews for validation); the
 * shared flags and set-up are in src/cli/cmd_common.h. */
#include <stdio.h>
#include <string.h>

#include "autograd/bq.h"
#include "src/cli/args.h"
#include "src/cli/cli.h"
#include "src/cli/cmd_common.h"
#include "src/cli/qa_setup.h"

/* Question answering: the encoder (and qa_outputs when the model has them) trained on the SQuAD
 * windows of d->path, no validation pass (the final model is the last step; `eval` scores EM/F1). */
static int finetune_qa(const char *model, const char *out, BqCliData *d, const BqTrainConfig *tc,
                       const BqCliSplits *sel, BqPrecision prec, BqCliQa *q) {
    BqTokenizer *tok = NULL;
    BqBert m;
    memset(&m, 0, sizeof m);
    BqSquadSet *s = NULL;
    BqQaSource qs;
    memset(&qs, 0, sizeof qs);
    BqBatchSource src;
    BqTrainResult res;
    int st;
    if ((st = bq_qa_model_load(&m, &tok, model, tc->seed, "finetune")) ||
        (st = bq_qa_data_load(&s, d, &m, tok, q, sel->train_samples, "finetune")))
        goto cleanup;
    if (sel->dropout >= 0) m.cfg.hidden_dropout_prob = m.cfg.attention_probs_dropout_prob = (float)sel->dropout;
    bq_qa_source_init(&qs, &src, s, s->n, sel->batch_size, 1, tc->seed);
    if ((st = bq_cli_train_run(&m, tc, prec, &src, NULL, d, out, &res))) goto cleanup;
    printf("; checkpoint %s\n", out);
cleanup:
    if (qs.order) bq_qa_source_free(&qs);
    bq_squad_free(s);
    if (tok) bq_tokenizer_free(tok);
    bq_bert_free(&m);
    return st;
}

int bq_cmd_finetune(int argc, char **argv) {
    const char *model = NULL, *out = NULL;
    BqCliData d = BQ_CLI_DATA_INIT;
    BqTrainConfig tc;
    BqCliSplits sp;
    bq_cli_train_default(&tc, &sp, 5e-5);
    BqCliQa q;
    bq_cli_qa_default(&q);
    const BqArgSpec specs[] = {
        {"model", BQ_ARG_STR, &model, "Hugging Face BERT directory or native checkpoint", 1, 0, 0},
        {"data", BQ_ARG_STR, &d.path, "IMDB archive/folder, CSV, TSV or JSONL; question answering: SQuAD v1.1 JSON", 1, 0, 0},
        {"out", BQ_ARG_OUT_MKDIR, &out, "output checkpoint directory (replaced atomically)", 1, 0, 0},
        BQ_CLI_TRAIN_SPECS(tc, sp),
        BQ_CLI_DATA_SPECS(d),
        BQ_CLI_TASK_SPEC(q),
        BQ_CLI_QA_WINDOW_SPECS(q),
    };
    BqArgs args = {.cmd = "finetune", .usage = "--model DIR --data PATH --out DIR [options]",
                   .summary = "Fine-tune BERT for sequence classification, or for SQuAD question answering "
                              "(--task qa or a BertForQuestionAnswering model), in fp32 with HF Trainer semantics.",
                   .specs = specs, .nspecs = (int)(sizeof specs / sizeof *specs),
                   .common = BQ_ARGS_THREADS | BQ_ARGS_PRECISION};
    int st = bq_args_parse(&args, argc, argv);
    if (st || args.help) return st;
    tc.vocab_dir = model;
    tc.tag = "finetune";
    int qa = 0;
    if ((st = bq_cli_task_resolve(&args, &q, model, &qa)) || (st = bq_cli_task_check_data(qa, d.path))) return st;
    bq_args_header(&args);
    if (qa) return finetune_qa(model, out, &d, &tc, &sp, args.prec, &q);

    BqTokenizer *tok = NULL;
    BqBert m;
    memset(&m, 0, sizeof m);
    BqTrainResult res;
    /* The model is loaded before the (possibly long) data encoding, so a wrong --model fails fast. */
    if ((st = bq_cli_model_load(&m, &tok, model, 0, tc.seed, "finetune")) ||
        (st = bq_cli_splits_load(&sp, &m, model, &d, tc.seed, tok, "finetune")) ||
        (st = bq_cli_train_run(&m, &tc, args.prec, &sp.strain, sp.val ? &sp.sval : NULL, &d, out, &res)))
        goto cleanup;
    printf("; checkpoint %s\n", out);

cleanup:
    bq_cli_splits_free(&sp);
    if (tok) bq_tokenizer_free(tok);
    bq_bert_free(&m);
    return st;
}
