// `meshrt tune`: a small grid (or a random sample of it) over --lr, --batch, --micro-batches and
// the mesh; short trainings one after another in this process (train's run, same token and
// validation files), a table sorted by validation loss, --json and --plot, early stops of
// trials that diverge or trail the best, and a state file in --out so an interrupted tune
// resumes where it stopped.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "tools/train.h"

namespace meshrt::cli {

struct TuneCliOptions {
  TrainCliOptions base;  // every train flag; --lr, --batch, ... are the defaults of the grid
  std::string grid_lr, grid_batch, grid_micro, grid_mesh;  // lists; "" = the base value
  int samples = 0;           // > 0: that many grid points drawn at random (--search-seed)
  uint64_t search_seed = 1;  // the draw
  double margin = 0.25;      // stop a trial whose loss is over (1 + margin) x the best's
  std::string out, json, plot;
};

// The early stop of a trailing trial, and the training loss trials are ranked by without
// validation data: means over the last tune_loss_window(steps) logged steps, so one noisy step
// neither stops a better trial nor ranks it.
int tune_loss_window(int steps);  // steps / 10, within 1..50
// The mean of losses[end - w, end) with w = min(window, end); NaN when end is 0 or past the end
// of `losses`, or any of them is not finite.
double tune_window_mean(const std::vector<double>& losses, size_t end, int window);
// What trials are ranked by (lower is better): the validation loss when there is one (not NaN),
// else the mean of the last `window` training losses (tune_loss_window(--steps)).
double tune_rank_loss(const std::vector<double>& losses, double val_loss, int window);
// Whether a trial of `steps` steps whose losses so far are `mine` (one per step done) trails the
// best trial's `best`: in its second half, its windowed mean is over (1 + margin) x the best's
// over the same steps (a non-finite mean of its own trails; margin 0 or no best: never).
bool tune_trails(const std::vector<double>& mine, const std::vector<double>& best, int steps,
                 double margin);

CLI::App* add_tune_command(CLI::App& app, TuneCliOptions& o);
int run_tune(const TuneCliOptions& o, std::ostream& os);

}  // namespace meshrt::cli
