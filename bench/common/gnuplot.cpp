#include "bench/common/gnuplot.h"

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "runtime/error.h"
#include "runtime/output_file.h"

namespace meshrt::bench {

namespace {

std::string gp_shell_quote(const std::string& s) {
  std::string o = "'";
  for (char c : s) {
    if (c == '\'')
      o += "'\\''";
    else
      o += c;
  }
  return o + "'";
}

std::string gp_slurp(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace

std::string gp_quote(const std::string& s) {
  std::string o = "'";
  for (char c : s) {
    o += c;
    if (c == '\'') o += '\'';
  }
  return o + "'";
}

void render_gnuplot(const std::string& path, const GnuplotJob& job) {
  namespace fs = std::filesystem;
  static std::atomic<int> serial{0};
  const fs::path dir = fs::temp_directory_path() /
                       ("meshrt-plot-" + std::to_string(getpid()) + "-" + std::to_string(serial++));
  fs::create_directories(dir);
  const fs::path gp = dir / "plot.gp", png = dir / "plot.png";
  for (const auto& [name, text] : job.data) std::ofstream(dir / name, std::ios::binary) << text;
  auto script = [&](const char* term) {
    std::ofstream g(gp);
    g << "set terminal " << term << " size " << job.width << "," << job.height << " font \",10\"\n"
      << "set output " << gp_quote(png.string()) << "\n"
      << job.body(dir.string() + "/");
  };
  script("pngcairo");
  const std::string cmd = "gnuplot " + gp_shell_quote(gp.string()) + " 2>" +
                          gp_shell_quote((dir / "gnuplot.err").string());
  int rc = std::system(cmd.c_str());
  if (rc != 0) {  // no cairo: the libgd terminal
    script("png");
    rc = std::system(cmd.c_str());
  }
  const std::string err = gp_slurp(dir / "gnuplot.err");
  // gnuplot writes into the private folder; the plot reaches `path` as every output does.
  const std::string image = rc == 0 ? gp_slurp(png) : std::string();
  std::error_code ec;
  fs::remove_all(dir, ec);
  MESHRT_CHECK(rc == 0 && !image.empty(), job.flag << ": gnuplot failed (exit " << rc << ")"
                                                   << (err.empty() ? "" : ": " + err)
                                                   << "; install gnuplot (Debian: gnuplot-nox, "
                                                      "tools/install-deps.sh does it) or drop "
                                                   << job.flag);
  write_output_file(path, image, job.flag);
}

}  // namespace meshrt::bench
