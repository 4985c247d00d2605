/* fz_simcal.c - libFuzzer target: the simulator's calibration files
 * (qi_sim_params_load, what --sim-cal FILE reads; `qinfer calibrate -o`
 * writes them).
 *
 * Input: the file (a scratch file, since the reader takes a path).
 * Checked: a rejection has a one-line message and leaves the parameters as
 * they were; an accepted file's parameters pass qi_sim_params_set's range
 * checks one by one (what the file could not have set otherwise).
 */
#include <string.h>

#include "backend.h"
#include "fz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[4200];
    fz_path(path, sizeof path, "fuzz.cal");
    fz_write(path, data, size);
    qi_sim_params p, before;
    qi_sim_params_default(&p);
    before = p;
    qi_err e = {0};
    if (qi_sim_params_load(path, &p, &e) != QI_OK) {
        FZ_CHECK(e.msg[0] && !strchr(e.msg, '\n'), "a rejection without a one-line message: '%s'", e.msg);
        FZ_CHECK(memcmp(&p, &before, sizeof p) == 0, "a rejected file changed the parameters");
        fz_note("%s", e.msg);
        return 0;
    }
    qi_sim_params q;
    qi_sim_params_default(&q);
    FZ_CHECK(qi_sim_params_set(&q, "link", p.link, &e) == QI_OK, "link %g accepted from the file: %s", p.link, e.msg);
    FZ_CHECK(qi_sim_params_set(&q, "noise", p.noise, &e) == QI_OK, "noise %g accepted from the file: %s", p.noise,
             e.msg);
    FZ_CHECK(qi_sim_params_set(&q, "cpu_op_s", p.cpu_op_s, &e) == QI_OK, "cpu_op_s %g accepted from the file: %s",
             p.cpu_op_s, e.msg);
    return 0;
}
