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
#endif
