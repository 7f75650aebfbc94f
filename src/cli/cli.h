/* Subcommands of the bertqat executable. Each takes (argc, argv) with argv[0] the subcommand name,
 * returns a BqStatus, and leaves printing of errors to main.c. Results (tables, metrics) go to
 * stdout; progress goes to stderr. */
#ifndef BQ_CLI_H
#define BQ_CLI_H

int bq_cmd_tokenize(int argc, char **argv);   /* src/cli/cmd_tokenize.c */
int bq_cmd_data_stats(int argc, char **argv); /* src/cli/cmd_data.c */
int bq_cmd_finetune(int argc, char **argv);   /* src/cli/cmd_train.c */
int bq_cmd_eval(int argc, char **argv);       /* src/cli/cmd_eval.c */
int bq_cmd_predict(int argc, char **argv);    /* src/cli/cmd_eval.c */
int bq_cmd_export_hf(int argc, char **argv);  /* src/cli/cmd_export_hf.c */
int bq_cmd_calibrate(int argc, char **argv);  /* src/cli/cmd_quant.c */
int bq_cmd_qat(int argc, char **argv);        /* src/cli/cmd_quant.c */
int bq_cmd_info(int argc, char **argv);       /* src/cli/cmd_quant.c */
int bq_cmd_sensitivity(int argc, char **argv); /* src/cli/cmd_sensitivity.c */
int bq_cmd_export(int argc, char **argv);     /* src/cli/cmd_export.c */
int bq_cmd_pipeline(int argc, char **argv);   /* src/cli/cmd_pipeline.c */
int bq_cmd_bench(int argc, char **argv);      /* src/cli/cmd_bench.c */

#endif
