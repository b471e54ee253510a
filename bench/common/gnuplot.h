// PNG plots with gnuplot, as `sweep --plot` and `report --plot` draw them: the data files and the
// script go to a private temporary folder, gnuplot renders there (pngcairo, else the libgd png
// terminal), and the image reaches the user's path through runtime/output_file.h.
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace meshrt::bench {

// A gnuplot single-quoted string (a quote inside is doubled).
std::string gp_quote(const std::string& s);

struct GnuplotJob {
  std::string flag = "--plot";  // names the output in messages
  int width = 1100, height = 560;
  // Data files written into the folder first: (file name, contents).
  std::vector<std::pair<std::string, std::string>> data;
  // The script after "set terminal ... / set output ...": given the folder's path (with a
  // trailing '/'), so data files are gp_quote(dir + name).
  std::function<std::string(const std::string& dir)> body;
};

// Renders `job` into `path`; throws naming job.flag, gnuplot's exit status and its stderr when it
// fails (install gnuplot or drop the flag).
void render_gnuplot(const std::string& path, const GnuplotJob& job);

}  // namespace meshrt::bench
