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

CLI::App* add_tune_command(CLI::App& app, TuneCliOptions& o);
int run_tune(const TuneCliOptions& o, std::ostream& os);

}  // namespace meshrt::cli
