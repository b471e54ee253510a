// The plugin loader (runtime/plugin.h) on fake plugins (tests/install/fake_plugin.c, built by
// tests/runtime/CMakeLists.txt into MESHRT_FAKE_PLUGIN_DIR): what it accepts, and the one-line
// error naming the library and why for everything it refuses.
#include <stdlib.h>
#include <sys/stat.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <string>
#include <vector>

#include "meshrt/version.h"
#include "runtime/error.h"
#include "runtime/plugin.h"
#include "tests/common/files.h"

using namespace meshrt;

namespace {

// The loader's error for plugin `name`, or "" when it loaded.
std::string plugin_load_error(const std::string& name) {
  try {
    detail::load_plugin(name);
  } catch (const Error& e) {
    return e.message();
  }
  return "";
}

// MESHRT_BACKEND_PATH for one test case, restored after it.
struct PluginPathEnv {
  explicit PluginPathEnv(const std::string& v) {
    if (const char* old = getenv("MESHRT_BACKEND_PATH")) saved = old, had = true;
    setenv("MESHRT_BACKEND_PATH", v.c_str(), 1);
  }
  ~PluginPathEnv() {
    if (had) {
      setenv("MESHRT_BACKEND_PATH", saved.c_str(), 1);
    } else {
      unsetenv("MESHRT_BACKEND_PATH");
    }
  }
  std::string saved;
  bool had = false;
};

const std::string kPluginFakeDir = MESHRT_FAKE_PLUGIN_DIR;

std::string plugin_fake_path(const std::string& kind) {
  return kPluginFakeDir + "/libmeshrt-fake-" + kind + ".so";
}

}  // namespace

TEST_CASE("plugin loader: the search path and the file name", "[unit]") {
  PluginPathEnv env("/nonexistent::" + kPluginFakeDir);
  CHECK(detail::plugin_file_name("cuda") == "libmeshrt-cuda.so");
  const std::vector<std::string> dirs = detail::plugin_search_path();
  REQUIRE(dirs.size() == 3);  // the two folders (the empty entry skipped), then the program's
  CHECK(dirs[0] == "/nonexistent");
  CHECK(dirs[1] == kPluginFakeDir);
  CHECK(detail::find_plugin("fake-ok") == plugin_fake_path("ok"));
  CHECK(detail::find_plugin("fake-absent").empty());
}

TEST_CASE("plugin loader: a plugin of this version and ABI loads once", "[unit]") {
  PluginPathEnv env(kPluginFakeDir);
  CHECK(detail::loaded_plugin_path("fake-ok").empty());
  const void* t = detail::load_plugin("fake-ok");
  REQUIRE(t != nullptr);
  CHECK(*static_cast<const int*>(t) == 42);  // fake_plugin.c's table
  CHECK(detail::load_plugin("fake-ok") == t);
  CHECK(detail::loaded_plugin_path("fake-ok") == plugin_fake_path("ok"));
}

TEST_CASE("plugin loader: a missing plugin is one line naming the file, dlerror and the path",
          "[unit]") {
  PluginPathEnv env(kPluginFakeDir);
  const std::string e = plugin_load_error("fake-absent");
  CHECK(e.find('\n') == std::string::npos);
  CHECK(e.rfind("cannot load the fake-absent backend (libmeshrt-fake-absent.so): "
                "libmeshrt-fake-absent.so: cannot open shared object file: No such file or "
                "directory (searched " +
                    kPluginFakeDir + ", ",
                0) == 0);
  CHECK(e.find("; set MESHRT_BACKEND_PATH to its folder)") != std::string::npos);
}

TEST_CASE(
    "plugin loader: refuses another version, another ABI, another name, a refusal and no "
    "entry point, in one line each",
    "[unit]") {
  PluginPathEnv env(kPluginFakeDir);
  const std::string v = MESHRT_VERSION_STRING;
  const std::string tail = " (plugin ABI 1): install the plugin built with this libmeshrt.so";
  CHECK(plugin_load_error("fake-version") ==
        "cannot load the fake-version backend: " + plugin_fake_path("version") +
            " is fake-version 0.0.0 (plugin ABI 1), not the fake-version plugin of meshrt " + v +
            tail);
  CHECK(plugin_load_error("fake-abi") ==
        "cannot load the fake-abi backend: " + plugin_fake_path("abi") + " is fake-abi " + v +
            " (plugin ABI 99), not the fake-abi plugin of meshrt " + v + tail);
  CHECK(plugin_load_error("fake-name") ==
        "cannot load the fake-name backend: " + plugin_fake_path("name") + " is other " + v +
            " (plugin ABI 1), not the fake-name plugin of meshrt " + v + tail);
  CHECK(plugin_load_error("fake-refuse") ==
        "cannot load the fake-refuse backend: " + plugin_fake_path("refuse") +
            " is a plugin that refused, not the fake-refuse plugin of meshrt " + v + tail);
  CHECK(plugin_load_error("fake-noentry") ==
        "cannot load the fake-noentry backend: " + plugin_fake_path("noentry") +
            " has no meshrt_backend_init_v1 entry point: not a meshrt plugin");
  // A refused plugin is not remembered as loaded.
  CHECK(detail::loaded_plugin_path("fake-version").empty());
}

TEST_CASE(
    "plugin loader: a FIFO, a directory or a character device named as the plugin is refused, "
    "naming the path and its type",
    "[unit]") {
  // Before the check, dlopen of the FIFO blocked in open() until a writer came: forever.
  const std::filesystem::path dir = test::scratch_dir("plugin-not-regular");
  const std::string fifo = (dir / "libmeshrt-fake-fifo.so").string();
  const std::string folder = (dir / "libmeshrt-fake-dir.so").string();
  const std::string chr = (dir / "libmeshrt-fake-chr.so").string();
  REQUIRE(mkfifo(fifo.c_str(), 0600) == 0);
  std::filesystem::create_directory(folder);
  std::filesystem::create_symlink("/dev/null", chr);  // stat follows it: a character device
  PluginPathEnv env(dir.string());
  const std::string tail =
      ", not a regular file (a shared library): remove it, or set "
      "MESHRT_BACKEND_PATH to the folder of the real libmeshrt-fake-";
  CHECK(plugin_load_error("fake-fifo") == "cannot load the fake-fifo backend: " + fifo +
                                              " is a FIFO (named pipe)" + tail + "fifo.so");
  CHECK(plugin_load_error("fake-dir") ==
        "cannot load the fake-dir backend: " + folder + " is a directory" + tail + "dir.so");
  CHECK(plugin_load_error("fake-chr") ==
        "cannot load the fake-chr backend: " + chr + " is a character device" + tail + "chr.so");
  CHECK(detail::loaded_plugin_path("fake-fifo").empty());
}
