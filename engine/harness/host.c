/* host.c - the facts a run records about where it ran: the git checkout
 * (revision, and whether the work tree differs from it) and the machine
 * (qi_sysinfo, plus the NVIDIA driver's own version).
 *
 * git runs as a child process through posix_spawnp, without a shell (no
 * quoting of the directory name) and without fork's copy of a large process;
 * when git is missing or the directory is not a checkout, the facts are
 * "unknown", never an error: a figure measured outside a checkout is still a
 * figure. Reading libgit2 or .git/ directly was considered; the git program is
 * what people trust to say "dirty", untracked files included.
 */
#include <errno.h>
#include <fcntl.h>
#include <spawn.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "db.h"
#include "qinfer/sysinfo.h"

#ifndef QI_VERSION
#define QI_VERSION "unknown"
#endif

/* Run git with `args` (argv[0] "git") without a shell; its standard output,
 * cut to n - 1 bytes, in out; *total = bytes it wrote. True when it exited 0. */
static bool run_git(char *const args[], char *out, size_t n, size_t *total) {
    extern char **environ;
    int fd[2];
    out[0] = 0;
    *total = 0;
    if (pipe(fd) != 0) return false;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fd[1], STDOUT_FILENO);
    posix_spawn_file_actions_addclose(&fa, fd[0]);
    posix_spawn_file_actions_addclose(&fa, fd[1]);
    posix_spawn_file_actions_addopen(&fa, STDERR_FILENO, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_addopen(&fa, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
    pid_t pid;
    int rc = posix_spawnp(&pid, "git", &fa, NULL, args, environ);
    posix_spawn_file_actions_destroy(&fa);
    close(fd[1]);
    if (rc != 0) {
        close(fd[0]);
        return false;
    }
    size_t used = 0;
    char buf[4096];
    for (;;) {
        ssize_t got = read(fd[0], buf, sizeof buf);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) break;
        size_t take = (size_t)got < n - 1 - used ? (size_t)got : n - 1 - used;
        memcpy(out + used, buf, take);
        used += take;
        *total += (size_t)got;
    }
    out[used] = 0;
    close(fd[0]);
    int status;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR) return false;
    return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

bool qi_db_git_info(const char *dir, char *rev, size_t n, int *dirty) {
    if (rev && n) rev[0] = 0;
    if (dirty) *dirty = -1;
    if (!dir || !rev || n < 2 || !dirty) return false;
    char out[128];
    size_t total;
    char *rev_args[] = {"git", "-C", (char *)dir, "rev-parse", "HEAD", NULL};
    if (!run_git(rev_args, out, sizeof out, &total)) return false;
    size_t len = strspn(out, "0123456789abcdef");
    if (len < 40 || len >= n || (out[len] != '\n' && out[len] != 0)) return false;
    char status[8];
    char *status_args[] = {"git", "-C", (char *)dir, "status", "--porcelain", NULL};
    if (!run_git(status_args, status, sizeof status, &total)) return false;
    memcpy(rev, out, len);
    rev[len] = 0;
    *dirty = total > 0;
    return true;
}

void qi_db_host_get(qi_db_host *h, const char *source_dir) {
    memset(h, 0, sizeof *h);
    h->git_dirty = -1;
    if (source_dir) qi_db_git_info(source_dir, h->git_rev, sizeof h->git_rev, &h->git_dirty);
    qi_sysinfo hw;
    qi_sysinfo_get(&hw);
    snprintf(h->cpu, sizeof h->cpu, "%s", hw.cpu_model);
    h->cores = hw.n_cores;
    h->mem_bytes = hw.mem_bytes;
    if (hw.n_gpus > 0) {
        snprintf(h->gpu, sizeof h->gpu, "%s", hw.gpu_name);
        /* The kernel module's version is the driver's own (e.g. 550.54.15);
         * the CUDA runtime only knows which CUDA version the driver serves. */
        char ver[32] = "";
        FILE *f = fopen("/sys/module/nvidia/version", "r");
        if (f) {
            if (fgets(ver, sizeof ver, f)) ver[strcspn(ver, "\n")] = 0;
            fclose(f);
        }
        int maj = hw.cuda_driver / 1000, min = hw.cuda_driver % 1000 / 10;
        if (ver[0]) snprintf(h->gpu_driver, sizeof h->gpu_driver, "%s (CUDA %d.%d)", ver, maj, min);
        else snprintf(h->gpu_driver, sizeof h->gpu_driver, "CUDA %d.%d", maj, min);
    }
}

void qi_db_run_info_init(qi_db_run_info *info, const qi_db_host *host) {
    memset(info, 0, sizeof *info);
    info->git_dirty = -1;
    info->engine_version = QI_VERSION;
    if (!host) return;
    info->git_rev = host->git_rev[0] ? host->git_rev : NULL;
    info->git_dirty = host->git_dirty;
    info->cpu = host->cpu[0] ? host->cpu : NULL;
    info->cores = host->cores;
    info->mem_bytes = host->mem_bytes;
    info->gpu = host->gpu[0] ? host->gpu : NULL;
    info->gpu_driver = host->gpu_driver[0] ? host->gpu_driver : NULL;
}
