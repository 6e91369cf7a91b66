/* Start-up calibration of the adaptive-depth cost table (spec/autodepth.h). */
#ifndef TANDEM_SPEC_CALIBRATE_H
#define TANDEM_SPEC_CALIBRATE_H
#include "tandem.h"

/* Times, on a scratch session, a target forward of T tokens as a verify
 * runs it (logits for every row) for T = 1..max_k+1 and a few larger T (the
 * rows of up to `rows` concurrent requests at max_k), and one MTP draft
 * step; `reps` (at least; up to 15 where the rounds are fast enough to fit
 * 0.3 s and the context holds them) repeats each, interleaved, the median
 * goes into the engine's cost table (which real steps then keep updating).
 * About 3 x (max_k + 4) forwards on a memory-bound 1.5 GB model (a few
 * seconds); on the demo model 15 rounds, tens of milliseconds. */
int td_engine_calibrate_spec(td_engine *eng, int max_k, int rows, int reps, td_err *err);

/* CUDA graphs at start-up: on a backend with graphs (and without
 * enforce_eager) runs, on a scratch session, a short greedy and a short
 * sampled generation at every depth 0..max_depth, so that the graphs of one
 * request's decode, MTP draft and verify forwards are captured before the
 * first request (shapes of several requests at once are captured when first
 * seen). summary: "" on a backend without graphs, else one line: graphs
 * captured here, graphs held, their nodes and the device memory their
 * instantiation took. */
int td_engine_capture_graphs(td_engine *eng, int max_depth, char *summary, size_t cap, td_err *err);
#endif
