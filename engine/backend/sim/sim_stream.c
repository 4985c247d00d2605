/* sim_stream.c - the simulated GPU's copy stream: its copy engine, a
 * stream with a clock of its own beside the GPU's compute stream, so an
 * upload queued there overlaps the ops queued on the main stream, as
 * cudaMemcpyAsync on a second stream does on the machine.
 *
 * A copy on it starts when both its clock and the host have reached it
 * (max(copy, host): the host issued it then) and ends its duration later
 * (backend_sim.c's cost of the same copy on the main stream: the link's
 * latency and bandwidth); only the copy stream's clock moves. A marker
 * records the copy clock (no earlier than the host); a wait moves the copy
 * clock up to the event's time; the main stream waiting for a copy-stream
 * event moves the main clock up to it (backend_sim.c's wait: an event's
 * time whatever its stream), and a synchronise waits for both. The link
 * is one resource: copies on the two streams in the same direction do not
 * share its bandwidth here (the engine queues its uploads on one of them).
 *
 * The simulated CPU has one stream: work asked of its copy stream runs on
 * the host's clock, as its main stream's does. */
#include "sim_stream.h"

static void issue(qi_backend *b, double dur) {
    const sim_clocks c = sim_clocks_of(b);
    if (c.gpu) {
        const double start = *c.copy > *c.host ? *c.copy : *c.host;
        *c.copy = start + dur;
    } else {
        *c.host += dur;
    }
    *c.busy_copies += dur;
    (*c.copies)++;
    (*c.n_copies)++;
}

void sim_cs_copy_2d(qi_backend *b, void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                    size_t height) {
    issue(b, sim_copy_cost(b, dst, dpitch, src, spitch, width, height));
}

void sim_cs_copy(qi_backend *b, void *dst, const void *src, size_t n) { sim_cs_copy_2d(b, dst, n, src, n, n, 1); }

void sim_cs_mark(qi_backend *b, qi_event *ev) {
    const sim_clocks c = sim_clocks_of(b);
    if (*c.copy < *c.host) *c.copy = *c.host;
    qi_event_complete(ev, *c.copy);
}

void sim_cs_wait(qi_backend *b, qi_event *ev) {
    const sim_clocks c = sim_clocks_of(b);
    const double t = qi_event_time(ev);
    if (t > *c.copy) *c.copy = t;
}
