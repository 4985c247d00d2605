/* main.c - the qinfer program: dispatch to subcommands. Only this layer turns
 * a qi_status into an exit code. */
#include <stdio.h>
#include <string.h>

#include "cli.h"

static const struct {
    const char *name;
    int (*fn)(int, char **);
    const char *summary;
} k_cmds[] = {
    {"generate", qi_cmd_generate, "generate text from a prompt, streaming tokens"},
    {"ppl", qi_cmd_ppl, "perplexity of a text file, as llama-perplexity computes it"},
    {"inspect", qi_cmd_inspect, "print a GGUF file's metadata and tensor table"},
    {"tokenize", qi_cmd_tokenize, "print the token ids (and pieces) of a text"},
    {"bench", qi_cmd_bench, "prompt and decode throughput, as llama-bench measures them"},
    {"sysinfo", qi_cmd_sysinfo, "print the CPU, memory and GPU figures are labelled with"},
    {"calibrate", qi_cmd_calibrate, "fit the simulator's parameters to step times measured here (or published)"},
    {"sim-validate", qi_cmd_sim_validate, "published GPU figures beside the simulated ones, and the error"},
    {"profile", qi_cmd_profile, "FFN neuron profile: activation counts, mass and hot-set locality per layer"},
    {"neuron-plan", qi_cmd_neuron, "a neuron policy's split of the FFN neurons between the fast and slow device"},
    {"agree", qi_cmd_agree, "how closely a KV policy follows the full cache (top-1, KL)"},
    {"needle", qi_cmd_needle, "passkey retrieval at several lengths and depths under a KV policy"},
    {"run", qi_cmd_run, "run an experiment script's sweep into the results database"},
    {"submit", qi_cmd_submit, "submit an experiment's sweep to Slurm as a job array, one shard per task"},
    {"lua", qi_cmd_lua, "run a Lua script with the qinfer module (no sweep, no database)"},
    {"synth", qi_cmd_synth, "write a llama-shaped GGUF with random weights, for throughput runs"},
    {"serve", qi_cmd_serve, "serve the model over HTTP: an OpenAI-compatible API, batched"},
    {"load", qi_cmd_load, "load-test qinfer serve at rising arrival rates until the latency SLO breaks"},
    {"results", qi_cmd_results, "list experiments, or an experiment's metrics as a table, CSV or JSON"},
};

static void usage(FILE *f) {
    fprintf(f,
            "usage: qinfer COMMAND [options]   (qinfer COMMAND --help for each)\n\n"
            "qinfer %s - a research harness for GPU-CPU collaborative LLM inference.\n\ncommands:\n",
            QI_VERSION);
    for (size_t i = 0; i < sizeof k_cmds / sizeof k_cmds[0]; i++)
        fprintf(f, "  %-11s %s\n", k_cmds[i].name, k_cmds[i].summary);
    fprintf(f,
            "\nModels: -m takes a GGUF path or the short name of a fetched model\n"
            "(models/fetch.sh --list); the cache is $QINFER_CACHE or ~/.cache/qinfer.\n");
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return QI_EXIT_USAGE;
    }
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "help") == 0) {
        usage(stdout);
        return 0;
    }
    if (strcmp(argv[1], "--version") == 0) {
        printf("qinfer %s\n", QI_VERSION);
        return 0;
    }
    for (size_t i = 0; i < sizeof k_cmds / sizeof k_cmds[0]; i++)
        if (strcmp(argv[1], k_cmds[i].name) == 0) return k_cmds[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "qinfer: unknown command '%s' (see qinfer --help)\n", argv[1]);
    return QI_EXIT_USAGE;
}
